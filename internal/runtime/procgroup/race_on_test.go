//go:build race

package procgroup

// raceDetector: the test binary runs under the race detector, whose
// ThreadSanitizer maps more memory at start than a tight RLIMIT_DATA allows.
const raceDetector = true
