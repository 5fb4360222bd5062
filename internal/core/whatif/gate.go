package whatif

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

// statsOf is the replayed trust of a type: its outcomes as the candidate's
// decisions made them, and its gate facts (block streak, remembered
// decisions, canary and trial places, probe time) as the candidate's
// claims took them.
func (e *engine) statsOf(typ string) *scoring.Stats {
	s := e.stats[typ]
	if s == nil {
		s = &scoring.Stats{Type: typ}
		e.stats[typ] = s
	}
	return s
}

// pool is the mesh's pooled evidence from the replayed trust, measured
// again when an outcome changed.
func (e *engine) pool() *scoring.Pool {
	if e.poolAt == e.total && e.pooled != nil {
		return e.pooled
	}
	all := make([]scoring.Stats, 0, len(e.stats))
	for _, typ := range sortedTypes(e.stats) {
		all = append(all, *e.stats[typ])
	}
	e.pooled, e.poolAt = scoring.NewPool(all, e.o.Scoring), e.total
	return e.pooled
}

// decide is the gate's decision on a pass under the candidate, read and
// claimed as services/gate reads and claims (decide, evaluate, claim),
// with the type's gate facts in memory instead of the trust bucket.
func (e *engine) decide(tr *taskRun, run events.Run, now time.Time, hold events.Hold, since time.Time) task.GateOut {
	t := tr.t
	pol := e.o.Policy.For(t.Type)
	sc := pol.Scoring(e.o.Scoring).WithDefaults()
	sc.Exempt = []string{} // the policy says which types are exempt
	pool := e.pool()
	prior := sc.PriorOf(pool, t.Type)
	sc.Canary = sc.CanariesWith(prior)
	st := e.statsOf(t.Type)
	in := task.GateIn{Task: t, Run: run, Hold: hold, Since: since, Arrived: now, Delivered: 1, Now: now,
		Exempt: pol.IsExempt(), Scoring: sc, Pool: pool, Stats: st.Clone(), Claimed: map[task.Claim]bool{}}
	if hold != "" {
		in.Delivered = task.FullLookEvery // a look at a held pass: the full look
	}
	in.Verdict = sc.EvaluateWith(t.Type, in.Stats, prior, run.Attempt > 1)
	if pol.DailyBudget != nil {
		in.Spent = e.spend[[2]string{t.Type, scoring.Day(now)}]
		in.OverBudget = pol.DailyBudget.Exceeded(in.Spent.Tokens, in.Spent.Cost) && !run.Reviewed
	}
	out := task.Decide(in)
	for out.Act == task.ActAsk {
		in.Claimed[out.Ask] = e.claim(out.Ask, tr, out.Run, st, sc, in.Stats, now)
		out = task.Decide(in)
	}
	key := events.MsgID(t.ID, run.Pass, "gate")
	if out.ResetStreak {
		*st, _, _ = sc.Gate(*st, key, false)
	}
	switch out.Act {
	case task.ActBlock, task.ActHandoff, task.ActHold:
		*st, _ = scoring.Release(*st, t.ID) // a canary the gate stops gives up its place
	}
	return out
}

// claim answers a claim of run (as the decision moved it) as the trust
// store's compare-and-set would, on the in-memory gate facts st
// (task.ClaimIn); trial places are counted on
// the facts the decision read (view), as the gate counts them.
func (e *engine) claim(c task.Claim, tr *taskRun, run events.Run, st *scoring.Stats, sc scoring.Policy, view scoring.Stats, now time.Time) bool {
	if c == task.ClaimTrial || c == task.ClaimCanary || c == task.ClaimRung {
		e.releaseEnded(st, tr.t.ID)
	}
	if c == task.ClaimTrial {
		next, ok, _ := sc.AdmitTrial(*st, tr.t.ID, now, sc.TrialPlaces(view))
		*st = next
		return ok
	}
	next, ok := task.ClaimIn(c, *st, sc, tr.t.ID, run, now)
	*st = next
	return ok
}

// releaseEnded frees the places of tasks the what-if ended (the gate
// frees those of tasks that ended when a claim is refused).
func (e *engine) releaseEnded(st *scoring.Stats, self string) {
	over := func(c scoring.Canary) bool { return c.Key != self && e.ended[c.Key] }
	st.Canaries = slices.DeleteFunc(slices.Clone(st.Canaries), over)
	st.Rungs = slices.DeleteFunc(slices.Clone(st.Rungs), over)
}

// describe says a gate decision in a few words.
func describe(act string, d events.TrustDecision) string {
	s := act
	if d.Cause != "" {
		s += " (" + string(d.Cause) + ")"
	}
	if d.Threshold != 0 || d.Score != 0 {
		s += fmt.Sprintf(" at score %.2f, threshold %.2f", d.Score, d.Threshold)
	}
	return s
}

func itoa(n int) string { return strconv.Itoa(n) }
