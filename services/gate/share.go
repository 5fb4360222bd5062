package gate

import (
	"sync"
	"time"
)

// ShareWindow is how far back the gate counts a type's admissions to judge
// its share of the queue before the model (crowded).
const ShareWindow = 10 * time.Second

// crowded reports whether a trusted first pass of taskType should wait
// its turn (task.GateIn.Crowded): the sweeper found the queue before the
// model full (Config.MaxBacklog) at its last read, and this gate admitted
// more than a share of it — MaxBacklog/4 — of taskType within the last
// ShareWindow. A type that sends a few passes goes straight through; one
// that floods the queue takes its turn from the held index, woken as the
// queue drains, each waiting type in turn. Without a held index, nobody
// waits.
func (s *Service) crowded(taskType string, now time.Time) bool {
	if s.cfg.Held == nil || s.cfg.MaxBacklog < 0 || !s.full.Load() {
		return false
	}
	return s.recent.count(taskType, now) > max(1, s.cfg.MaxBacklog/4)
}

// admissions counts admissions by type over a sliding window, in two
// halves: the current half and the one before.
type admissions struct {
	mu         sync.Mutex
	half       time.Duration
	start      time.Time // of the current half
	now, prior map[string]int
}

func newAdmissions(window time.Duration) *admissions {
	return &admissions{half: window / 2, now: map[string]int{}, prior: map[string]int{}}
}

// roll moves the halves on to at.
func (a *admissions) roll(at time.Time) {
	switch {
	case at.Sub(a.start) < a.half:
	case at.Sub(a.start) < 2*a.half:
		a.prior, a.now, a.start = a.now, map[string]int{}, a.start.Add(a.half)
	default:
		a.prior, a.now, a.start = map[string]int{}, map[string]int{}, at
	}
}

// add counts one admission of taskType at at.
func (a *admissions) add(taskType string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(at)
	a.now[taskType]++
}

// count is taskType's admissions within the last window or so (between
// one and two halves back).
func (a *admissions) count(taskType string, at time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(at)
	return a.now[taskType] + a.prior[taskType]
}
