//go:build !race

package procgroup

const raceDetector = false
