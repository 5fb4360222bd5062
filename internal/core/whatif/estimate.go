package whatif

import (
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

// measure is what the history measured of attempts so far: how many,
// what they spent, how many succeeded, per rung.
type measure struct {
	attempts, successes int
	tokens              int64
	cost                float64
	rungs               map[events.Rung][2]int // tries, successes
}

func (m *measure) add(rung events.Rung, res events.Result) {
	if rung == "" {
		rung = events.RungRefine
	}
	if m.rungs == nil {
		m.rungs = map[events.Rung][2]int{}
	}
	r := m.rungs[rung]
	r[0]++
	m.attempts++
	m.tokens += int64(res.TokensIn + res.TokensOut)
	m.cost += res.Cost
	if res.Outcome == events.OutcomeSuccess {
		r[1]++
		m.successes++
	}
	m.rungs[rung] = r
}

func (e *engine) measure(typ string) *measure {
	m := e.measured[typ]
	if m == nil {
		m = &measure{}
		e.measured[typ] = m
	}
	return m
}

// rate is the measured success rate of an attempt on rung: the type's on
// that rung, else the type's on any rung, else the mesh's on the rung,
// else the mesh's; 0 when nothing was measured.
func (e *engine) rate(typ string, rung events.Rung) float64 {
	if rung == "" {
		rung = events.RungRefine
	}
	m := e.measure(typ)
	for _, r := range [][2]int{m.rungs[rung], {m.attempts, m.successes}, e.mesh.rungs[rung], {e.mesh.attempts, e.mesh.successes}} {
		if r[0] > 0 {
			return float64(r[1]) / float64(r[0])
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
// recorder would), each succeeding with the measured rate of its rung and
// costing the type's measured mean, until the ladder hands off. The
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
		p := e.rate(tr.t.Type, state.Rung)
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
	s := e.statsOf(tr.t.Type)
	s.Outcomes, _ = scoring.Insert(s.Outcomes, scoring.Outcome{Key: events.MsgID(tr.t.ID, run.Pass, "estimate"), Task: tr.t.ID,
		Success: est.Resolved >= 0.5, At: now, Rung: run.Rung, Retry: run.Attempt > 1, Probe: run.Probe, End: true}, scoring.Keep)
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
