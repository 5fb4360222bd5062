package recorder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// A recorder killed after its writes and before its ack gets the outcome
// again later, behind more outcomes of the type than the trust window
// holds: the type's daily spend, its trust outcomes and the subject's
// history count it once (issue 9, defect 2) — the streams keep one copy
// of each message its Msg-Id names.
func TestOutcomeRedeliveredBehindAFullWindowCountsOnce(t *testing.T) {
	h := recorderOn(t, nil)
	ctx := context.Background()
	success := events.Result{Outcome: events.OutcomeSuccess, Approach: "fix", TokensIn: 100, TokensOut: 10, Cost: 0.001}
	first := executed(t, events.Task{ID: "first", Type: "css_fix", Subject: "a.css"}, 1, 1, events.RungRefine, success)
	h.handle(first)
	for i := range trust.DefaultWindow + 10 {
		m := executed(t, events.Task{ID: fmt.Sprintf("later-%d", i), Type: "css_fix", Subject: fmt.Sprintf("s%d.css", i)}, 1, 1, events.RungRefine, success)
		m.Time = m.Time.Add(time.Duration(i+1) * time.Millisecond)
		h.handle(m)
	}
	first.Delivered = 2
	h.handle(first)

	outcomes := trust.DefaultWindow + 11
	view, err := trust.NewView(ctx, h.js, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Stop()
	if got := view.Stats("css_fix").Outcomes; len(got) != outcomes {
		t.Fatalf("%d outcomes on the stream, want %d: the redelivered one counted twice", len(got), outcomes)
	}
	if rec, err := h.hist.Recent(ctx, "css_fix", "a.css"); err != nil || len(rec.Outcomes) != 1 {
		t.Fatalf("history of a.css = %+v (%v), want the one outcome", rec, err)
	}
	got, err := trust.NewSpending(h.js, services.CounterStream).On(ctx, "css_fix", first.Time)
	if err != nil {
		t.Fatal(err)
	}
	if want := (trust.Spend{Tokens: 110 * outcomes, Cost: 0.001 * float64(outcomes)}); got.Tokens != want.Tokens || trust.NanoUSD(got.Cost) != trust.NanoUSD(want.Cost) {
		t.Fatalf("spent %+v, want %+v: the redelivered outcome counted twice", got, want)
	}
}

// An answer that reaches the recorder after a human cancelled the task
// (the model answered as the cancel landed) is not recorded: no attempt, no
// outcome for trust, no retry; the task stays cancelled.
func TestOutcomeAfterACancelIsIgnored(t *testing.T) {
	h := recorderOn(t, nil)
	ctx := context.Background()
	tk := events.Task{ID: "gone", Type: "css_fix", Subject: "a.css"}
	st := task.New(tk)
	st.Status = events.StatusRunning
	st = task.Act(st, events.Action{TaskID: "gone", Action: events.ActionCancel, By: "alice", At: now})
	if _, _, err := h.tasks.Create(ctx, st); err != nil {
		t.Fatal(err)
	}
	failure := events.Result{Outcome: events.OutcomeFailure, Approach: "guess", Error: "still broken", TokensIn: 100, TokensOut: 10}
	if outs := h.handle(executed(t, tk, 1, 1, events.RungRefine, failure)); len(outs) != 0 {
		t.Fatalf("recorder on a cancelled task: %d outputs, want none (no outcome, no history, no retry)", len(outs))
	}
	got, err := h.tasks.Get(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != events.StatusCancelled || got.Attempts != 0 || len(got.History) != 0 {
		t.Fatalf("state after the late answer: %s, %d attempts, history %+v", got.Status, got.Attempts, got.History)
	}
}

// A recorder killed after its writes and before its ack gets a failed
// attempt again after its retry went on and the gate handed that retry off
// (its rung's retries rarely succeed): the redelivery publishes neither the
// retry again nor a second escalation (found by the long fault suite: a task
// ended twice, escalated at pass 4 by the gate and at pass 3 by the
// redelivered outcome). Before the retry is taken up, a redelivery still
// publishes the retry (same Msg-Id), so a kill between the write and the
// publish loses nothing.
func TestOutcomeRedeliveredAfterTheGateHandedOffTheRetry(t *testing.T) {
	ctx := context.Background()
	h := recorderOn(t, nil)
	tasks := h.tasks
	tk := events.Task{ID: "twice", Type: "bug_fix", Subject: "a.go"}
	m := executed(t, tk, 1, 1, events.RungRefine, failed(events.ErrorClassTask, "still broken"))
	all := h.handle(m)
	first := moves(all)
	// bug_fix has no verifier: the retry goes straight to the gate.
	if len(first) != 1 || first[0].Subject != events.TaskSubject(tk.ID, events.StageVerified) || all[len(all)-1].Subject != first[0].Subject {
		t.Fatalf("first delivery: %+v; want the retry (verified), last", all)
	}
	m.Delivered = 2
	again := moves(h.handle(m))
	if len(again) != 1 || again[0].MsgID != first[0].MsgID {
		t.Fatalf("redelivery before the retry is taken up: %+v; want the same retry again", again)
	}

	next := events.Base{Task: tk, Run: events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine}, At: now, By: "gate@test"}
	if _, _, err := tasks.Apply(ctx, tk.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.HandOff(st, found, next, "HANDOFF before attempt 2: REFINE retries rarely succeed")
	}); err != nil {
		t.Fatal(err)
	}
	m.Delivered = 3
	if late := moves(h.handle(m)); len(late) != 0 {
		t.Fatalf("redelivery after the gate handed the retry off: %+v; want no task event", late)
	}
	st, err := tasks.Get(ctx, tk.ID)
	if err != nil || st.Status != events.StatusBlocked || st.Pass != 2 || st.Cause != events.CauseRungRate {
		t.Fatalf("state %+v, %v: want the gate's handoff of pass 2 kept", st, err)
	}
}

// The spend counters count what a type's daily budget caps, and nothing
// of a type without one: they exist for the gate's budget alone.
func TestSpendCountedOnlyWhereABudgetCaps(t *testing.T) {
	h := recorderOn(t, nil)
	ctx := context.Background()
	spent := events.Result{Outcome: events.OutcomeSuccess, Approach: "fix", TokensIn: 100, TokensOut: 10, Cost: 0.001}
	for _, typ := range []string{"css_fix", "free_fix"} {
		h.handle(executed(t, events.Task{ID: "t-" + typ, Type: typ, Subject: "a"}, 1, 1, events.RungRefine, spent))
	}
	all, err := trust.NewSpending(h.js, services.CounterStream).All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 {
		t.Fatalf("counters %+v, want css_fix's only", all)
	}
	for k, d := range all {
		if k[0] != "css_fix" || d.Tokens != 110 || d.NanoUSD != trust.NanoUSD(0.001) {
			t.Errorf("counter %v = %+v, want 110 tokens and $0.001", k, d)
		}
	}
}

// withState is m's executed event carrying at as the state the executor
// left (events.StateAt).
func withState(t *testing.T, m *services.Msg, at events.StateAt) *services.Msg {
	t.Helper()
	var ev events.Executed
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		t.Fatal(err)
	}
	ev.State = &at
	data, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	c := *m
	c.Data = data
	return &c
}

// The state an executed event carries is where the recorder's write
// starts, never what it decides on unchecked: a human's cancel written
// after it makes it stale, and the recorder records nothing; a current one
// is recorded from.
func TestCarriedStateIsCheckedByItsRevision(t *testing.T) {
	ctx := context.Background()
	h := recorderOn(t, nil)
	start := func(id string) (events.Task, events.StateAt) {
		t.Helper()
		tk := events.Task{ID: id, Type: "bug_fix", Subject: "a.go"}
		b := events.Base{Task: tk, Run: events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}, At: now, By: "executor@test"}
		if _, _, err := h.tasks.Create(ctx, task.New(tk)); err != nil {
			t.Fatal(err)
		}
		at, _, err := h.tasks.ApplyAt(ctx, id, nil, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Begin(st, found, b)
		})
		if err != nil || at.Rev == 0 || at.State.Status != events.StatusRunning {
			t.Fatalf("begin: %+v, %v", at, err)
		}
		return tk, at
	}

	tk, at := start("stale")
	if _, _, err := h.tasks.Apply(ctx, tk.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.Act(st, events.Action{TaskID: tk.ID, Action: events.ActionCancel, By: "alice", At: now}), task.CauseApplied
	}); err != nil {
		t.Fatal(err)
	}
	m := withState(t, executed(t, tk, 1, 1, events.RungRefine, failed(events.ErrorClassTask, "still broken")), at)
	if outs := h.handle(m); len(outs) != 0 {
		t.Fatalf("outcome carrying a state older than a cancel: %d outputs, want none", len(outs))
	}
	if st, err := h.tasks.Get(ctx, tk.ID); err != nil || st.Status != events.StatusCancelled || st.Attempts != 0 {
		t.Fatalf("state %+v, %v: want the cancel kept, no attempt recorded", st, err)
	}

	tk, at = start("current")
	m = withState(t, executed(t, tk, 1, 1, events.RungRefine, failed(events.ErrorClassTask, "still broken")), at)
	outs := moves(h.handle(m))
	if len(outs) != 1 || outs[0].Subject != events.TaskSubject(tk.ID, events.StageVerified) {
		t.Fatalf("outputs %+v, want the retry (verified)", outs)
	}
	if e, err := h.tasks.Get(ctx, tk.ID); err != nil || e.Attempts != 1 {
		t.Fatalf("state %+v, %v: want the attempt recorded", e, err)
	}
}
