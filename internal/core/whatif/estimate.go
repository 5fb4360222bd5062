package whatif

import (
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

// Recent is how many of the newest attempts (of a type on a rung, of a
// type, of the mesh) an estimate's success rate is measured on: recent
// enough that a type that regressed is estimated as it is now.
const Recent = 20

// measure is what the history measured of attempts so far: how many and
// what they spent (for the mean cost), and whether each of the newest
// Recent succeeded, per kind of attempt (first, or a retry's rung).
type measure struct {
	attempts int
	tokens   int64
	cost     float64
	all      []bool
	rungs    map[events.Rung][]bool
}

// kindOf is the kind of attempt a rate is measured for: a first attempt,
// or a retry on its rung.
func kindOf(attempt int, rung events.Rung) events.Rung {
	if attempt <= 1 {
		return "first"
	}
	if rung == "" {
		return events.RungRefine
	}
	return rung
}

func recent(w []bool, ok bool) []bool {
	w = append(w, ok)
	if len(w) > Recent {
		w = w[len(w)-Recent:]
	}
	return w
}

func (m *measure) add(run events.Run, res events.Result) {
	if m.rungs == nil {
		m.rungs = map[events.Rung][]bool{}
	}
	ok := res.Outcome == events.OutcomeSuccess
	k := kindOf(run.Attempt, run.Rung)
	m.rungs[k] = recent(m.rungs[k], ok)
	m.all = recent(m.all, ok)
	m.attempts++
	m.tokens += int64(res.TokensIn + res.TokensOut)
	m.cost += res.Cost
}

func (e *engine) measure(typ string) *measure {
	m := e.measured[typ]
	if m == nil {
		m = &measure{}
		e.measured[typ] = m
	}
	return m
}

// rate is the measured success rate of an attempt of kind k (kindOf) over
// the newest Recent: the type's of that kind, else the mesh's of that kind
// (a retry on a rung the type never reached is more like other types'
// retries there than like its own first attempts), else the type's of any
// kind, else the mesh's; 0 when nothing was measured.
func (e *engine) rate(typ string, k events.Rung) float64 {
	m := e.measure(typ)
	for _, w := range [][]bool{m.rungs[k], e.mesh.rungs[k], m.all, e.mesh.all} {
		if len(w) > 0 {
			n := 0
			for _, ok := range w {
				if ok {
					n++
				}
			}
			return float64(n) / float64(len(w))
		}
	}
	return 0
}

// meanCost is the type's measured mean tokens and cost per attempt (the
// mesh's when the type has none).
func (e *engine) meanCost(typ string) (tokens, cost float64) {
	for _, m := range []*measure{e.measure(typ), &e.mesh} {
		if m.attempts > 0 {
			return float64(m.tokens) / float64(m.attempts), m.cost / float64(m.attempts)
		}
	}
	return 0, 0
}

// estimate estimates the rest of a task from run, an attempt the
// candidate runs and the history never ran: attempt after attempt up its
// ladder (the candidate's ladder.Config, each failure climbing it as the
// recorder would), each succeeding with the rate measured on the type's
// newest attempts of its kind (rate) and costing the type's measured mean, until the ladder hands off. The
// figures are expected values, added to Estimated.
func (e *engine) estimate(tr *taskRun, run events.Run, now time.Time) {
	pol := e.o.Policy.For(tr.t.Type)
	cfg := ladder.Config{MaxRetries: task.MaxRetries(tr.t, pol), RefineAttempts: pol.RefineAttempts, PivotAttempts: pol.PivotAttempts}
	state := ladder.State{Failed: max(run.Attempt-1-tr.st.RoundStart, 0), Rung: run.Rung, PivotCount: tr.st.PivotCount,
		DeadEnds: tr.st.DeadEnds, RoundStart: tr.st.RoundStart}
	tokens, cost := e.meanCost(tr.t.Type)
	var est Estimated
	reach := 1.0
	for attempt := run.Attempt; reach > 1e-9; attempt++ {
		p := e.rate(tr.t.Type, kindOf(attempt, state.Rung))
		est.Attempts += reach
		est.Tokens += reach * tokens
		est.Cost += reach * cost
		est.Resolved += reach * p
		reach *= 1 - p
		d := cfg.Next(state, ladder.Outcome{Attempt: attempt, Approach: fmt.Sprintf("estimated attempt %d", attempt)})
		if d.Handoff() {
			est.ToHuman += reach
			break
		}
		state = d.State
	}
	est.Tasks = 1
	tr.est = est
	// The task enters its type's trust as its likelier end: the gate
	// scores the types the estimates change as it would have.
	e.record(tr.t.Type, scoring.Outcome{Key: events.MsgID(tr.t.ID, run.Pass, "estimate"), Task: tr.t.ID,
		Success: est.Resolved >= 0.5, At: now, Rung: run.Rung, Retry: run.Attempt > 1, Probe: run.Probe, Held: run.Readmitted, End: true})
	tr.mode = estimating
	e.ended[tr.t.ID] = true // its places are not held in the replay
	tr.wi.Fate, tr.wi.Decision, tr.wi.Resolve = FateEstimated, "estimate", est.Resolved
	tr.wi.Reason = fmt.Sprintf("from attempt %d on %s at %s: %.1f more attempts, %.0f tokens, resolves with p=%.2f",
		run.Attempt, orRefine(run.Rung), now.UTC().Format(time.RFC3339), est.Attempts, est.Tokens, est.Resolved)
}

func orRefine(r events.Rung) events.Rung {
	if r == "" {
		return events.RungRefine
	}
	return r
}
