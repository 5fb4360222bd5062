package services

import "sync/atomic"

// RunStats is what a Router has done with one service's messages since
// the process started, and whether it is consuming. The service's micro
// service reports it ($SRV.STATS) and its readiness check reads it. The
// zero value is ready to use; a nil *RunStats records nothing.
type RunStats struct {
	running                   atomic.Bool
	handled, failed, inFlight atomic.Int64
}

// RunCounts is a snapshot of RunStats.
type RunCounts struct {
	// Running is true while the service's consumer is bound and consumed.
	Running bool `json:"running"`
	// Handled counts messages settled (acked, snoozed, retried, dead-lettered
	// or handed back at shutdown).
	Handled int64 `json:"handled"`
	// Errors counts messages whose handler failed: retried or dead-lettered.
	Errors int64 `json:"errors"`
	// InFlight is how many messages the handlers hold now.
	InFlight int64 `json:"in_flight"`
}

// Counts reads s.
func (s *RunStats) Counts() RunCounts {
	if s == nil {
		return RunCounts{}
	}
	return RunCounts{Running: s.running.Load(), Handled: s.handled.Load(), Errors: s.failed.Load(), InFlight: s.inFlight.Load()}
}

// Running reports whether the service consumes.
func (s *RunStats) Running() bool { return s != nil && s.running.Load() }

func (s *RunStats) setRunning(v bool) {
	if s != nil {
		s.running.Store(v)
	}
}

func (s *RunStats) begin() {
	if s != nil {
		s.inFlight.Add(1)
	}
}

func (s *RunStats) end() {
	if s != nil {
		s.inFlight.Add(-1)
	}
}

// settled counts one message by its result (the results of Metrics).
func (s *RunStats) settled(result Result) {
	if s == nil {
		return
	}
	s.handled.Add(1)
	if result == ResultRetried || result == ResultDead {
		s.failed.Add(1)
	}
}

// SetRunning says whether the service takes work (for services that do not
// run under a Router, such as the review page).
func (s *RunStats) SetRunning(v bool) { s.setRunning(v) }

// Begin counts one piece of work in flight, handled outside a Router (a
// request to the review page); done counts it handled, and an error when
// it failed.
func (s *RunStats) Begin() (done func(failed bool)) {
	s.begin()
	return func(failed bool) {
		s.end()
		if failed {
			s.settled(ResultDead)
		} else {
			s.settled(ResultOK)
		}
	}
}
