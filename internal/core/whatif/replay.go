package whatif

import (
	"slices"
	"sort"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

// mode is where a task's what-if stands against its history.
type mode int

const (
	stepping   mode = iota // decided as the history did so far: its events are facts for the what-if too
	holding                // the candidate holds a pass the history let through: looked at again later
	ended                  // the what-if ended the task
	estimating             // the candidate runs attempts the history never ran: estimated
)

// taskRun is one task on both sides.
type taskRun struct {
	t     events.Task
	first time.Time
	// lastPass is the highest pass the history holds for the task; stops:
	// the history holds an end of it (a success, a hand-off, a block, a
	// cancel).
	lastPass int
	stops    bool

	actual  Fate
	counted map[int]bool // passes whose attempt the actual side counted

	// The what-if: its state under the candidate, the pass it is at.
	wi        Fate
	st        events.TaskState
	mode      mode
	pass      int
	in        map[int]events.Run // each pass's run as it reached the gate
	admitted  map[int]bool
	wiCounted map[int]bool
	heldSince time.Time
	heldRun   events.Run
	requeue   *events.Action
	est       Estimated
	// parted: the what-if decided otherwise than the history at least
	// once; cause says where first.
	parted bool
	cause  string
}

// engine folds the events.
type engine struct {
	o        Options
	tasks    map[string]*taskRun
	order    []*taskRun
	stats    map[string]*scoring.Stats
	spend    map[[2]string]scoring.Spend
	measured map[string]*measure
	mesh     measure
	holding  map[string][]*taskRun
	ended    map[string]bool
	last     time.Time
	// version counts each type's outcome changes; looked is the version
	// of the type's last full look at the passes the candidate holds;
	// pooled is the pool as of poolAt (the sum of versions).
	version map[string]int
	looked  map[string]int
	total   int
	pooled  *scoring.Pool
	poolAt  int
}

// Replay re-decides the history evs (in stream order) under o.Policy and
// reports actual against what-if.
func Replay(evs []Event, o Options) Report {
	e := &engine{o: o, tasks: map[string]*taskRun{}, stats: map[string]*scoring.Stats{}, spend: map[[2]string]scoring.Spend{},
		measured: map[string]*measure{}, holding: map[string][]*taskRun{}, ended: map[string]bool{},
		version: map[string]int{}, looked: map[string]int{}, poolAt: -1}
	for _, ev := range evs {
		tr := e.task(ev)
		if tr == nil {
			continue
		}
		switch ev.Kind {
		case KindQueued, KindVerified, KindRetry:
			tr.lastPass = max(tr.lastPass, ev.Base.Run.Pass)
		case KindSucceeded, KindEscalated, KindGated, KindHandoff, KindStuck, KindCancelled:
			tr.stops = true
		}
	}
	for _, ev := range evs {
		e.step(ev)
	}
	end := o.End
	if end.IsZero() {
		end = e.last
	}
	for typ := range e.holding {
		e.look(typ, end, nil)
	}
	return e.report()
}

// task is the task ev is about (nil: an action on a task never seen).
func (e *engine) task(ev Event) *taskRun {
	id := ev.Base.Task.ID
	if ev.Kind == KindAction {
		id = ev.Action.TaskID
	}
	if tr := e.tasks[id]; tr != nil {
		return tr
	}
	if ev.Kind == KindAction || id == "" {
		return nil
	}
	tr := &taskRun{t: ev.Base.Task, first: ev.Base.At, pass: 1, in: map[int]events.Run{}, admitted: map[int]bool{},
		counted: map[int]bool{}, wiCounted: map[int]bool{}, st: task.New(ev.Base.Task),
		actual: Fate{Fate: FateInFlight, Decision: "admit"}, wi: Fate{Fate: FateInFlight, Decision: "admit"}}
	e.tasks[id] = tr
	e.order = append(e.order, tr)
	return tr
}

func (e *engine) step(ev Event) {
	tr := e.task(ev)
	if tr == nil {
		return
	}
	if ev.Base.At.After(e.last) {
		e.last = ev.Base.At
	}
	e.recorded(tr, ev)
	e.whatif(tr, ev)
	switch ev.Kind {
	case KindAdmitted, KindHeld, KindGated, KindHandoff:
		// The gate decided for the type now: it looks at the passes the
		// candidate holds too.
		e.look(tr.t.Type, ev.Base.At, tr)
	}
}

// recorded tallies the history's side, and measures the type's attempts
// (what an estimate is made of).
func (e *engine) recorded(tr *taskRun, ev Event) {
	a, cause := &tr.actual, string(ev.Trust.Cause)
	switch ev.Kind {
	case KindExecuted:
		if tr.counted[ev.Base.Run.Pass] {
			return
		}
		tr.counted[ev.Base.Run.Pass] = true
		a.Attempts++
		a.Tokens += int64(ev.Result.TokensIn + ev.Result.TokensOut)
		a.Cost += ev.Result.Cost
		e.measure(tr.t.Type).add(ev.Base.Run, ev.Result)
		e.mesh.add(ev.Base.Run, ev.Result)
	case KindAdmitted:
		a.Fate, a.Decision, a.Cause, a.Reason = FateInFlight, "admit", cause, ev.Trust.Reason
	case KindHeld:
		a.Fate, a.Decision, a.Cause, a.Reason = FateHeld, "hold", cause, ev.Reason
	case KindGated:
		a.Fate, a.Decision, a.Cause, a.Reason = FateToHuman, "block", cause, ev.Reason
	case KindHandoff:
		a.Fate, a.Decision, a.Cause, a.Reason = FateToHuman, "handoff", string(events.CauseRungRate), ev.Reason
	case KindSucceeded:
		a.Fate, a.Decision, a.Cause, a.Reason = FateResolved, "succeeded", "", ""
	case KindEscalated:
		a.Fate, a.Decision, a.Cause, a.Reason = FateToHuman, "handoff", CauseLadder, ev.Reason
	case KindStuck:
		a.Fate, a.Decision, a.Cause, a.Reason = FateToHuman, "stuck", CauseStuck, ev.Reason
	case KindCancelled:
		a.Fate, a.Decision, a.Cause, a.Reason = FateCancelled, "cancelled", "", ev.Reason
	case KindRetry:
		a.Fate, a.Decision, a.Cause, a.Reason = FateInFlight, "retry", "", ev.Reason
	case KindAction:
		if ev.Action.Action == events.ActionCancel {
			a.Fate, a.Decision, a.Cause, a.Reason = FateCancelled, "cancelled", "", "cancelled by "+ev.Action.By
		}
	}
}

// Recorder causes (Fate.Cause) besides the gate's.
const (
	CauseLadder     = "ladder"      // the ladder ran out (max_retries), or the recorder handed off
	CauseTaskBudget = "budget_task" // the task spent its budget
	CauseStuck      = "stuck"       // a pipeline's skip budget ran out
	CauseFailed     = "failed"      // a pipeline step failed the task
)

// whatif moves the candidate's side on one event.
func (e *engine) whatif(tr *taskRun, ev Event) {
	pass := ev.Base.Run.Pass
	switch ev.Kind {
	case KindRetry:
		if ev.Base.Run.Reviewed && tr.requeue != nil && tr.mode == ended && !tr.parted && tr.wi.Fate == FateToHuman {
			// A human requeued a task the what-if sent to them too.
			tr.st = task.Act(tr.st, *tr.requeue)
			tr.mode, tr.pass, tr.wi = stepping, pass, Fate{Fate: FateInFlight, Decision: "retry", Attempts: tr.wi.Attempts, Tokens: tr.wi.Tokens, Cost: tr.wi.Cost}
			delete(e.ended, tr.t.ID)
		}
		tr.requeue = nil
		return
	case KindAction:
		switch ev.Action.Action {
		case events.ActionRequeue:
			a := ev.Action
			tr.requeue = &a
		case events.ActionCancel:
			if tr.mode == stepping || tr.mode == holding {
				e.end(tr, Fate{Fate: FateCancelled, Decision: "cancelled", Reason: "cancelled by " + ev.Action.By})
			}
		}
		return
	}
	if tr.mode != stepping || pass != tr.pass {
		return
	}
	switch ev.Kind {
	case KindQueued:
		tr.st = task.Queued(ev.Base.Task, ev.Base.Run, 0)
	case KindVerified:
		if _, ok := tr.in[pass]; !ok {
			tr.in[pass] = ev.Base.Run
		}
	case KindAdmitted, KindHeld, KindGated, KindHandoff:
		if !tr.admitted[pass] {
			e.gateEvent(tr, ev)
		}
	case KindExecuted:
		if tr.admitted[pass] && !tr.wiCounted[pass] {
			e.attempt(tr, ev)
		}
	case KindCancelled:
		tr.st, _ = task.Cancel(tr.st, true, ev.Base, events.Verification{})
		e.end(tr, Fate{Fate: FateCancelled, Decision: "cancelled", Reason: ev.Reason})
	}
}

// actOf names a gate act as a fate decision (waiting for canaries delays
// a pass, it changes nothing of its fate).
func actOf(a task.GateAct) string { return a.Kind() }

// recordedAct names a recorded gate event as a fate decision.
func recordedAct(k Kind) string {
	switch k {
	case KindAdmitted:
		return "admit"
	case KindHeld:
		return "hold"
	case KindGated:
		return "block"
	}
	return "handoff"
}

// gateEvent re-decides the gate's decision on a pass the what-if is at.
func (e *engine) gateEvent(tr *taskRun, ev Event) {
	pass, now := ev.Base.Run.Pass, ev.Base.At
	run, ok := tr.in[pass]
	if !ok {
		run = ev.Base.Run
	}
	hold, since := events.Hold(""), tr.heldSince
	if !since.IsZero() {
		hold = events.HoldTrust
	}
	out := e.decide(tr, run, now, hold, since)
	got, had := actOf(out.Act), recordedAct(ev.Kind)
	if got != had || (got == "admit" && out.Run.Rung != ev.Base.Run.Rung) {
		tr.part("gate: " + describe(got, out.Trust) + ", where the history did " + had)
	}
	switch got {
	case "admit":
		tr.admitted[pass], tr.heldSince = true, time.Time{}
		tr.wi = Fate{Fate: FateInFlight, Decision: "admit", Cause: string(out.Trust.Cause), Reason: out.Trust.Reason, Attempts: tr.wi.Attempts, Tokens: tr.wi.Tokens, Cost: tr.wi.Cost}
		if had != "admit" || out.Run.Rung != ev.Base.Run.Rung {
			e.estimate(tr, out.Run, now)
		}
	case "hold":
		if tr.heldSince.IsZero() {
			tr.heldSince = now
			tr.st, _ = task.Hold(tr.st, true, ev.Base, out.Trust.Reason)
		}
		tr.wi.Fate, tr.wi.Decision, tr.wi.Cause, tr.wi.Reason = FateHeld, "hold", string(out.Trust.Cause), out.Trust.Reason
		if had != "hold" {
			tr.mode, tr.heldRun = holding, run
			e.holding[tr.t.Type] = append(e.holding[tr.t.Type], tr)
		}
	default:
		e.stopped(tr, out, run, now)
	}
}

// look looks again at the passes of type typ the candidate holds where
// the history went on: re-admitted (estimated from there), sent to a
// human at the hold time, or held on. but is the task the event was about.
// When none of the type's outcomes changed since the last full look, only
// the oldest passes are looked at, until one stays held: the type's score
// is as it was, so only a probe (one per interval) or the hold time (the
// oldest first) can move one.
func (e *engine) look(typ string, now time.Time, but *taskRun) {
	held := e.holding[typ]
	if len(held) == 0 {
		return
	}
	full := e.looked[typ] != e.version[typ]
	e.looked[typ] = e.version[typ]
	sc := e.o.Policy.For(typ).Scoring(e.o.Scoring).WithDefaults()
	order := task.WakeOrder(held, func(tr *taskRun) time.Time { return tr.heldSince }, sc.BacklogOf(*e.statsOf(typ)).NewestFirst(), sc.HoldTime, now)
look:
	for _, tr := range order {
		if tr.mode != holding || tr == but {
			continue
		}
		out := e.decide(tr, tr.heldRun, now, events.HoldTrust, tr.heldSince)
		switch actOf(out.Act) {
		case "admit":
			tr.wi.Cause, tr.wi.Reason = string(out.Trust.Cause), out.Trust.Reason
			e.estimate(tr, out.Run, now) // no longer holding
		case "hold":
			if !full {
				break look // the rest stays held as it is
			}
		default:
			e.stopped(tr, out, tr.heldRun, now) // no longer holding
		}
	}
	e.holding[typ] = slices.DeleteFunc(held, func(tr *taskRun) bool { return tr.mode != holding })
}

// record adds an outcome to a type's replayed trust.
func (e *engine) record(typ string, o scoring.Outcome) {
	s := e.statsOf(typ)
	var changed bool
	if s.Outcomes, changed = scoring.Insert(s.Outcomes, o, scoring.Keep); changed {
		e.version[typ]++
		e.total++
	}
}

// stopped ends a task the candidate's gate stops (block, handoff): it
// goes to a human; the gate marks the end of a retry's task in its
// type's trust.
func (e *engine) stopped(tr *taskRun, out task.GateOut, run events.Run, now time.Time) {
	d := actOf(out.Act)
	if d == "handoff" || run.Attempt > 1 {
		e.record(tr.t.Type, scoring.EndMarker(tr.t.ID, run.Pass, now))
	}
	e.end(tr, Fate{Fate: FateToHuman, Decision: d, Cause: string(out.Trust.Cause), Reason: out.Trust.Reason})
}

// end ends the what-if of a task with fate f (its tallies kept).
func (e *engine) end(tr *taskRun, f Fate) {
	f.Attempts, f.Tokens, f.Cost = tr.wi.Attempts, tr.wi.Tokens, tr.wi.Cost
	tr.wi, tr.mode = f, ended
	e.ended[tr.t.ID] = true
}

func (tr *taskRun) part(cause string) {
	if !tr.parted {
		tr.parted, tr.cause = true, cause
	}
}

// attempt folds a recorded attempt of a pass the candidate let through
// into the what-if: the recorder's decision under the candidate.
func (e *engine) attempt(tr *taskRun, ev Event) {
	b, res, pass := ev.Base, ev.Result, ev.Base.Run.Pass
	tr.wiCounted[pass] = true
	tr.wi.Attempts++
	tr.wi.Tokens += int64(res.TokensIn + res.TokensOut)
	tr.wi.Cost += res.Cost
	if st, c := task.Executed(tr.st, true, b, res); c.Changed() {
		tr.st = st
	}
	pol := e.o.Policy.For(tr.t.Type)
	next, judged, c := task.Record(tr.st, true, b, res, pol, ev.Stored)
	if !c.Changed() {
		return
	}
	key := events.MsgID(tr.t.ID, pass, "outcome")
	if task.CountsForTrust(judged) {
		e.record(tr.t.Type, task.TrustOutcome(key, next, b.Run, judged, ev.Stored))
	}
	if tokens, cost := task.DailySpend(judged, pol.DailyBudget); tokens != 0 || cost != 0 {
		k := [2]string{tr.t.Type, scoring.Day(ev.Stored)}
		sp := e.spend[k]
		sp.Tokens += tokens
		sp.Cost += cost
		e.spend[k] = sp
	}
	tr.st = next
	switch next.Decision {
	case events.DecisionSucceeded:
		e.end(tr, Fate{Fate: FateResolved, Decision: "succeeded"})
	case events.DecisionHandoff, events.DecisionFail, events.DecisionStuck:
		cause := CauseLadder
		switch {
		case next.Decision == events.DecisionFail:
			cause = CauseFailed
		case next.Decision == events.DecisionStuck:
			cause = CauseStuck
		case pol.Budget.Exceeded(next.TokensIn+next.TokensOut, next.Cost):
			cause = CauseTaskBudget
		}
		if tr.lastPass > pass {
			tr.part("recorder: " + string(next.Decision) + " after attempt " + itoa(b.Run.Attempt) + " (" + cause + "), where the history went on")
		}
		e.end(tr, Fate{Fate: FateToHuman, Decision: string(next.Decision), Cause: cause, Reason: next.Reason})
	default: // retry, park: the next pass
		tr.pass = next.Pass
		tr.wi.Fate, tr.wi.Decision = FateInFlight, string(next.Decision)
		if tr.lastPass < next.Pass && tr.stops {
			// The history never ran that pass: it ended the task here.
			tr.part("recorder: " + string(next.Decision) + " after attempt " + itoa(b.Run.Attempt) + ", where the history ended the task")
			e.estimate(tr, task.NextRun(&next, b.Run, judged, pol), ev.Stored)
		}
	}
}

// sortedTypes lists the types of m in order.
func sortedTypes[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
