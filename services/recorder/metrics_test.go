package recorder_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// executed is the executor's outcome message of one attempt.
func executed(t *testing.T, tk events.Task, pass, attempt int, rung events.Rung, res events.Result) *services.Msg {
	t.Helper()
	data, err := json.Marshal(events.Executed{
		Base:   events.Base{Task: tk, Run: events.Run{Pass: pass, Attempt: attempt, Rung: rung}, At: now, By: "executor@test"},
		Result: res,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &services.Msg{Subject: events.TaskSubject(tk.ID, events.StageExecuted), Data: data, Seq: uint64(pass), Delivered: 1,
		Time: now.Add(time.Duration(pass) * time.Second)}
}

func spent(r events.Result, in, out int, cost float64) events.Result {
	r.TokensIn, r.TokensOut, r.Cost = in, out, cost
	return r
}

func TestSpendMetricsCountEachOutcomeOnce(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := recorderOn(t, reg)
	tasks, ctx := h.tasks, context.Background()
	handle := func(m *services.Msg) { t.Helper(); h.handle(m) }
	refine, pivot := events.RungRefine, events.RungPivot

	// fix-a: the same failure twice, then a success on PIVOT.
	a := events.Task{ID: "fix-a", Type: "css_fix", Subject: "a.css", MaxRetries: 5}
	a1 := executed(t, a, 1, 1, refine, spent(failed(events.ErrorClassTask, "still red"), 100, 10, 0.001))
	handle(a1)
	handle(executed(t, a, 2, 2, refine, spent(failed(events.ErrorClassTask, "still red"), 200, 20, 0.002)))
	a3 := executed(t, a, 3, 3, pivot, spent(ok(), 300, 30, 0.003))
	handle(a3)
	// fix-b: a deterministic failure, then its repeat refused: handed off.
	b := events.Task{ID: "fix-b", Type: "css_fix", Subject: "b.css", MaxRetries: 2}
	handle(executed(t, b, 1, 1, refine, spent(failed(events.ErrorClassDeterministic, "400 unknown parameter"), 400, 0, 0.004)))
	b2 := executed(t, b, 2, 2, refine, events.Result{Outcome: events.OutcomeFailure, ErrorClass: events.ErrorClassRefused,
		Refused: true, Error: "refused: identical to a request that already failed deterministically"})
	handle(b2)

	// Redeliveries — the last outcome of each task, and an earlier pass —
	// find their pass recorded and count nothing.
	handle(a3)
	handle(a1)
	handle(b2)

	want := `
# HELP dispatch_attempts_total Attempts recorded, by type, rung (none for pipeline steps) and outcome (success, failure, refused).
# TYPE dispatch_attempts_total counter
dispatch_attempts_total{outcome="failure",rung="REFINE",type="css_fix"} 3
dispatch_attempts_total{outcome="refused",rung="REFINE",type="css_fix"} 1
dispatch_attempts_total{outcome="success",rung="PIVOT",type="css_fix"} 1
# HELP dispatch_retries_total Attempts made after a failed attempt of the same task, by type, rung and outcome (success, failure, refused).
# TYPE dispatch_retries_total counter
dispatch_retries_total{outcome="failure",rung="REFINE",type="css_fix"} 1
dispatch_retries_total{outcome="refused",rung="REFINE",type="css_fix"} 1
dispatch_retries_total{outcome="success",rung="PIVOT",type="css_fix"} 1
# HELP dispatch_same_error_retries_total Failed attempts whose reason equals the task's previous failure's, of any error class, by type.
# TYPE dispatch_same_error_retries_total counter
dispatch_same_error_retries_total{type="css_fix"} 1
# HELP dispatch_tasks_finished_total Tasks that ended, by type, status (succeeded, blocked, failed, needs_human_review, cancelled) and who ended them (by: recorder, gate, verifier, human).
# TYPE dispatch_tasks_finished_total counter
dispatch_tasks_finished_total{by="recorder",status="blocked",type="css_fix"} 1
dispatch_tasks_finished_total{by="recorder",status="succeeded",type="css_fix"} 1
# HELP dispatch_resolved_tokens_total Tokens (prompt and completion) spent by tasks that succeeded, by type.
# TYPE dispatch_resolved_tokens_total counter
dispatch_resolved_tokens_total{type="css_fix"} 660
# HELP dispatch_wasted_tokens_total Tokens (prompt and completion) spent by tasks that ended unresolved (blocked, failed), by type.
# TYPE dispatch_wasted_tokens_total counter
dispatch_wasted_tokens_total{type="css_fix"} 400
# HELP dispatch_wasted_cost_usd_total USD spent by tasks that ended unresolved (blocked, failed), by type.
# TYPE dispatch_wasted_cost_usd_total counter
dispatch_wasted_cost_usd_total{type="css_fix"} 0.004
`
	names := []string{"dispatch_attempts_total", "dispatch_retries_total", "dispatch_same_error_retries_total",
		"dispatch_tasks_finished_total", "dispatch_resolved_tokens_total", "dispatch_wasted_tokens_total", "dispatch_wasted_cost_usd_total"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if got := counter(t, reg, "dispatch_resolved_cost_usd_total"); got < 0.006-1e-12 || got > 0.006+1e-12 {
		t.Errorf("resolved cost = %v, want 0.006", got)
	}
	if n, sum := histogram(t, reg, "dispatch_resolved_attempts"); n != 1 || sum != 3 {
		t.Errorf("resolved attempts: %d tasks, %v attempts; want 1 task of 3 attempts", n, sum)
	}
	st, err := tasks.Get(ctx, "fix-b")
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != events.StatusBlocked || len(st.History) != 2 || st.History[1].ErrorClass != events.ErrorClassRefused {
		t.Fatalf("fix-b = %s, %+v; want blocked with the refusal's class recorded", st.Status, st.History)
	}

	// A human requeues fix-b and its next round succeeds: the round is
	// resolved, and the first round's spend stays counted as wasted only.
	if _, err := tasks.Update(ctx, "fix-b", func(st *events.TaskState, _ bool) error {
		*st = task.Act(*st, events.Action{TaskID: "fix-b", Action: events.ActionRequeue, By: "alice", At: now})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	handle(executed(t, b, 3, 3, refine, spent(ok(), 1000, 100, 0.01)))
	if got := counter(t, reg, "dispatch_resolved_tokens_total"); got != 660+1100 {
		t.Errorf("resolved tokens after the requeued round = %v, want 1760", got)
	}
	if got := counter(t, reg, "dispatch_wasted_tokens_total"); got != 400 {
		t.Errorf("wasted tokens after the requeued round = %v, want 400 still", got)
	}
	if n, sum := histogram(t, reg, "dispatch_resolved_attempts"); n != 2 || sum != 4 {
		t.Errorf("resolved attempts: %d tasks, %v attempts; want 2 tasks, 3+1 attempts", n, sum)
	}
}

func TestSpendMetricsWithoutRegistry(t *testing.T) {
	h := recorderOn(t, nil)
	tk := events.Task{ID: "fix-c", Type: "css_fix", Subject: "c.css"}
	if got := moves(h.handle(executed(t, tk, 1, 1, events.RungRefine, ok()))); len(got) != 1 {
		t.Fatalf("Handle without a registry: %+v", got)
	}
}

func TestTwoRecordersShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	recorderOn(t, reg)
	recorderOn(t, reg)
}

// counter sums a counter family's series.
func counter(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// histogram returns the sample count and sum of a histogram over all labels.
func histogram(t *testing.T, reg prometheus.Gatherer, name string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
				sum += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return n, sum
}
