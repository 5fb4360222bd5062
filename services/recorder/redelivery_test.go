package recorder_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"dispatchmesh/events"
	"dispatchmesh/history"
	"dispatchmesh/internal/natstest"
	"dispatchmesh/internal/policy"
	"dispatchmesh/internal/task"
	"dispatchmesh/services"
	"dispatchmesh/services/recorder"
	"dispatchmesh/trust"
)

// A recorder killed after its writes and before its ack gets the outcome
// again later, behind more outcomes of the type than the trust window
// holds: the type's daily spend and its trust window count it once
// (issue 9, defect 2).
func TestOutcomeRedeliveredBehindAFullWindowCountsOnce(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	stores, err := services.Provision(ctx, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	trustStore := trust.NewStore(stores.Trust, trust.Policy{})
	spending := trust.NewSpending(srv.JS, services.CounterStream)
	rec, err := recorder.New(recorder.Config{
		Tasks: services.NewTaskStore(stores.Tasks), Trust: trustStore, History: history.NewStore(stores.History, 0),
		Spending: spending, Policy: policy.Static(nil), Instance: "recorder@test",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	success := events.Result{Outcome: events.OutcomeSuccess, Approach: "fix", TokensIn: 100, TokensOut: 10, Cost: 0.001}
	first := executed(t, events.Task{ID: "first", Type: "css_fix", Subject: "a.css"}, 1, 1, events.RungRefine, success)
	if _, err := rec.Handle(ctx, first); err != nil {
		t.Fatal(err)
	}
	for i := range trust.DefaultWindow + 10 {
		m := executed(t, events.Task{ID: fmt.Sprintf("later-%d", i), Type: "css_fix", Subject: fmt.Sprintf("s%d.css", i)}, 1, 1, events.RungRefine, success)
		m.Time = m.Time.Add(time.Duration(i+1) * time.Millisecond)
		if _, err := rec.Handle(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	before, err := trustStore.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	first.Delivered = 2
	if _, err := rec.Handle(ctx, first); err != nil {
		t.Fatal(err)
	}
	after, err := trustStore.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after.Outcomes, before.Outcomes) {
		t.Fatal("the redelivered outcome changed the trust window")
	}
	got, err := spending.On(ctx, "css_fix", first.Time)
	if err != nil {
		t.Fatal(err)
	}
	outcomes := trust.DefaultWindow + 11
	if want := (trust.Spend{Tokens: 110 * outcomes, Cost: 0.001 * float64(outcomes)}); got.Tokens != want.Tokens || trust.NanoUSD(got.Cost) != trust.NanoUSD(want.Cost) {
		t.Fatalf("spent %+v, want %+v: the redelivered outcome counted twice", got, want)
	}
}

// An answer that reaches the recorder after a human cancelled the task
// (the model answered as the cancel landed) is not recorded: no attempt, no
// outcome for trust, no retry; the task stays cancelled.
func TestOutcomeAfterACancelIsIgnored(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	stores, err := services.Provision(ctx, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tasks := services.NewTaskStore(stores.Tasks)
	trustStore := trust.NewStore(stores.Trust, trust.Policy{})
	rec, err := recorder.New(recorder.Config{
		Tasks: tasks, Trust: trustStore, History: history.NewStore(stores.History, 0),
		Policy: policy.Static(nil), Instance: "recorder@test",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	tk := events.Task{ID: "gone", Type: "css_fix", Subject: "a.css"}
	st := task.New(tk)
	st.Status = events.StatusRunning
	st = task.Act(st, events.Action{TaskID: "gone", Action: events.ActionCancel, By: "alice", At: now})
	if _, _, err := tasks.Create(ctx, st); err != nil {
		t.Fatal(err)
	}
	failure := events.Result{Outcome: events.OutcomeFailure, Approach: "guess", Error: "still broken", TokensIn: 100, TokensOut: 10}
	outs, err := rec.Handle(ctx, executed(t, tk, 1, 1, events.RungRefine, failure))
	if err != nil || len(outs) != 0 {
		t.Fatalf("recorder on a cancelled task: %d outputs, %v", len(outs), err)
	}
	got, err := tasks.Get(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != events.StatusCancelled || got.Attempts != 0 || len(got.History) != 0 {
		t.Fatalf("state after the late answer: %s, %d attempts, history %+v", got.Status, got.Attempts, got.History)
	}
	stats, err := trustStore.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	if len(stats.Outcomes) != 0 {
		t.Fatalf("the late answer reached trust: %+v", stats.Outcomes)
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
	rec, tasks := recorderOn(t, nil)
	tk := events.Task{ID: "twice", Type: "bug_fix", Subject: "a.go"}
	m := executed(t, tk, 1, 1, events.RungRefine, failed(events.ErrorClassTask, "still broken"))
	first, err := rec.Handle(ctx, m)
	if err != nil || len(first) != 1 || first[0].Subject != events.TaskSubject(tk.ID, events.StageRetry) {
		t.Fatalf("first delivery: %+v, %v; want the retry", first, err)
	}
	m.Delivered = 2
	again, err := rec.Handle(ctx, m)
	if err != nil || len(again) != 1 || again[0].MsgID != first[0].MsgID {
		t.Fatalf("redelivery before the retry is taken up: %+v, %v; want the same retry again", again, err)
	}

	next := events.Base{Task: tk, Run: events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine}, At: now, By: "gate@test"}
	if _, _, err := tasks.Apply(ctx, tk.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.HandOff(st, found, next, "HANDOFF before attempt 2: REFINE retries rarely succeed")
	}); err != nil {
		t.Fatal(err)
	}
	m.Delivered = 3
	late, err := rec.Handle(ctx, m)
	if err != nil || len(late) != 0 {
		t.Fatalf("redelivery after the gate handed the retry off: %d outputs, %v; want none", len(late), err)
	}
	st, err := tasks.Get(ctx, tk.ID)
	if err != nil || st.Status != events.StatusBlocked || st.Pass != 2 || st.Cause != events.CauseRungRate {
		t.Fatalf("state %+v, %v: want the gate's handoff of pass 2 kept", st, err)
	}
}
