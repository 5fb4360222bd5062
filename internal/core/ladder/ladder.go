// Package ladder is the escalation ladder (SPEC §8) and pipeline step routing
// (SPEC §7) as pure functions: given a task's state and an attempt's outcome
// they say what happens next. The recorder persists what they return.
//
// The ladder, for one round of attempts (a human requeue starts a new round):
//
//	failed attempt   1      2      3      4      5         6 …
//	next rung        REFINE PIVOT  PIVOT  RESEARCH PIVOT … HANDOFF at max_retries
//
// REFINE retries the same approach adjusted; PIVOT requires an approach not in
// the dead-ends log; RESEARCH (once a round — its used flag is read from the
// round's dead ends) offers research tools; HANDOFF stops and asks a human.
// The HANDOFF guard is checked first, so the machine always ends. The
// deployment's faults (auth, quota, config, a tool that does not answer) and
// command timeouts short-circuit to HANDOFF. A task whose subject failed 3+
// times in the last 7 days starts on PIVOT, its subject's failed approaches
// its first dead ends.
package ladder

import (
	"strings"
	"time"
	"unicode"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Config holds the ladder's numbers. The zero value means the defaults.
type Config struct {
	// MaxRetries is the HANDOFF threshold: failed attempts per round. Default 7.
	MaxRetries int
	// RefineAttempts is how many attempts REFINE gets. Default 2.
	RefineAttempts int
	// PivotAttempts is how many PIVOT attempts come before RESEARCH. Default 2.
	PivotAttempts int
	// RecurringFailures on the same subject within RecurringWindow make a new
	// task start on PIVOT. Defaults 3 and 7 days.
	RecurringFailures int
	RecurringWindow   time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxRetries <= 0 {
		c.MaxRetries = 7
	}
	if c.RefineAttempts <= 0 {
		c.RefineAttempts = 2
	}
	if c.PivotAttempts <= 0 {
		c.PivotAttempts = 2
	}
	if c.RecurringFailures <= 0 {
		c.RecurringFailures = 3
	}
	if c.RecurringWindow <= 0 {
		c.RecurringWindow = 7 * 24 * time.Hour
	}
	return c
}

// Window is how far back recurring failures are counted.
func (c Config) Window() time.Duration { return c.withDefaults().RecurringWindow }

// StartRung is the rung of a new task's first attempt, given how often its
// (type, subject) failed within the recurring window.
func (c Config) StartRung(recentFailures int) events.Rung {
	if recentFailures >= c.withDefaults().RecurringFailures {
		return events.RungPivot
	}
	return events.RungRefine
}

// State is the ladder's part of a task's state.
type State struct {
	// Failed counts failed attempts in the current round, this one excluded.
	Failed int
	Rung   events.Rung
	// PivotCount counts the round's attempts made on PIVOT.
	PivotCount int
	// DeadEnds are the task's dead ends, of every round; an entry of
	// attempt 0 is an earlier task's failure on the subject. Next keeps
	// at most MaxDeadEnds (CapDeadEnds).
	DeadEnds []events.DeadEnd
	// RoundStart is the attempt count when the round began (a human's
	// requeue starts one): only the round's own dead ends use its RESEARCH
	// pass.
	RoundStart int
}

// Outcome is one attempt's result as the ladder sees it.
type Outcome struct {
	Attempt    int // the attempt's number (recorded in dead ends)
	Success    bool
	Approach   string
	Reason     string
	ErrorClass events.ErrorClass
}

// Decision is what the ladder says after an attempt.
type Decision struct {
	// Next is the rung of the next attempt, or RungHandoff: stop.
	Next  events.Rung
	State State
	// Reason explains a HANDOFF.
	Reason string
}

// Handoff reports whether the task stops here.
func (d Decision) Handoff() bool { return d.Next == events.RungHandoff }

// Next climbs the ladder after an attempt made on s.Rung.
func (c Config) Next(s State, o Outcome) Decision {
	c = c.withDefaults()
	if s.Rung == "" {
		s.Rung = events.RungRefine
	}
	if o.Success {
		s.Rung = events.RungRefine // a success at any rung resets the ladder
		return Decision{Next: events.RungRefine, State: s}
	}
	s.DeadEnds = CapDeadEnds(append(append([]events.DeadEnd(nil), s.DeadEnds...), events.DeadEnd{
		Approach: o.Approach, Reason: o.Reason, Attempt: o.Attempt, Rung: s.Rung,
	}))
	if s.Rung == events.RungPivot {
		s.PivotCount++ // attempts made on PIVOT, not transitions into it
	}
	s.Failed++
	switch {
	case s.Failed >= c.MaxRetries: // the guard comes first: the ladder always ends
		s.Rung = events.RungHandoff
		return Decision{Next: events.RungHandoff, State: s, Reason: "attempt limit reached"}
	case events.ShortCircuits(o.ErrorClass):
		s.Rung = events.RungHandoff
		return Decision{Next: events.RungHandoff, State: s, Reason: string(o.ErrorClass) + " failure: retrying cannot help"}
	case s.Rung == events.RungRefine && s.Failed < c.RefineAttempts:
		s.Rung = events.RungRefine
	case s.PivotCount < c.PivotAttempts:
		s.Rung = events.RungPivot
	case !ResearchUsedSince(s.DeadEnds, s.RoundStart):
		s.Rung = events.RungResearch
	default:
		s.Rung = events.RungPivot
	}
	return Decision{Next: s.Rung, State: s}
}

// ResearchUsed reports whether the one RESEARCH pass has been made: derived
// from the dead-ends log, never from a counter that can drift. A dead end
// of attempt 0 — an earlier task's, shown to this one — uses nothing.
// Within a task a human requeued, ResearchUsedSince says it of the round.
func ResearchUsed(deadEnds []events.DeadEnd) bool {
	return ResearchUsedSince(deadEnds, 0)
}

// ResearchUsedSince reports whether the RESEARCH pass of the round that
// began after attempt roundStart (TaskState.RoundStart) has been made: a
// dead end on RESEARCH of an attempt after roundStart.
func ResearchUsedSince(deadEnds []events.DeadEnd, roundStart int) bool {
	for _, d := range deadEnds {
		if d.Rung == events.RungResearch && d.Attempt > roundStart {
			return true
		}
	}
	return false
}

// RepeatsDeadEnd returns the dead end an approach repeats, if any. Approaches
// are compared normalised: case, punctuation and spacing do not matter.
func RepeatsDeadEnd(approach string, deadEnds []events.DeadEnd) (events.DeadEnd, bool) {
	n := Normalize(approach)
	if n == "" {
		return events.DeadEnd{}, false
	}
	for _, d := range deadEnds {
		if Normalize(d.Approach) == n {
			return d, true
		}
	}
	return events.DeadEnd{}, false
}

// Normalize lowercases s and collapses everything but letters and digits to
// single spaces.
func Normalize(s string) string {
	var b strings.Builder
	space := false
	for _, r := range strings.ToLower(s) {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			if space && b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteRune(r)
			space = false
		} else {
			space = true
		}
	}
	return b.String()
}

// Skip returns the rung a retry runs on when retries on some rungs are
// measured to rarely succeed (below reports it): rung itself when it earns
// its call, else the next rung up the ladder that does — REFINE, then PIVOT,
// then RESEARCH while its one pass is unused; RESEARCH falls back to PIVOT —
// or RungHandoff when none does. A rung without enough data is not below,
// so the ladder applies until there is data.
func Skip(rung events.Rung, researchUsed bool, below func(rung events.Rung) bool) events.Rung {
	var order []events.Rung
	switch rung {
	case events.RungRefine:
		order = []events.Rung{events.RungRefine, events.RungPivot, events.RungResearch}
	case events.RungPivot:
		order = []events.Rung{events.RungPivot, events.RungResearch}
	case events.RungResearch:
		order = []events.Rung{events.RungResearch, events.RungPivot}
	default:
		return rung
	}
	for _, r := range order {
		if r == events.RungResearch && researchUsed && r != rung {
			continue
		}
		if !below(r) {
			return r
		}
	}
	return events.RungHandoff
}
