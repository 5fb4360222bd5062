package task_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

// climbRound fails attempts from st until the ladder hands off and
// returns the rung each attempt ran on.
func climbRound(t *testing.T, st *events.TaskState) []events.Rung {
	t.Helper()
	var rungs []events.Rung
	for range 20 {
		run := events.Run{Pass: st.Pass, Attempt: st.Attempts + 1, Rung: st.Rung}
		rungs = append(rungs, run.Rung)
		task.Apply(st, events.Task{ID: "t"}, run, failed(events.ErrorClassTask, "broken"), policy.Type{}, now)
		if st.Decision == events.DecisionHandoff {
			return rungs
		}
	}
	t.Fatalf("no handoff after %v", rungs)
	return nil
}

// A human's requeue starts a new round that climbs the whole ladder again:
// its PIVOT attempts are counted from zero and its RESEARCH pass is its
// own (the first round's is no reason to skip it).
func TestRequeueClimbsTheWholeLadderAgain(t *testing.T) {
	want := []events.Rung{events.RungRefine, events.RungRefine, events.RungPivot, events.RungPivot,
		events.RungResearch, events.RungPivot, events.RungPivot}
	st := events.TaskState{ID: "t", Status: events.StatusRunning, Pass: 1, Rung: events.RungRefine}
	if rungs := climbRound(t, &st); !slices.Equal(rungs, want) {
		t.Fatalf("first round %v, want %v", rungs, want)
	}
	st = task.Act(st, events.Action{TaskID: "t", Action: events.ActionRequeue, By: "alice", Note: "try the parser", At: now})
	if st.PivotCount != 0 {
		t.Errorf("pivot_count %d after the requeue, want 0", st.PivotCount)
	}
	if rungs := climbRound(t, &st); !slices.Equal(rungs, want) {
		t.Fatalf("second round %v, want %v", rungs, want)
	}
	if len(st.DeadEnds) != 14 {
		t.Errorf("%d dead ends, want both rounds' 14: what failed before is still a dead end", len(st.DeadEnds))
	}
}

// A pipeline that goes back to an earlier step gives that step the input
// it ran with — implement gets its plan again, with the validator's error
// as context (seed 004: back "with the error as context", not without the
// plan) — and a task a human requeues resumes its step with it too.
func TestGotoStepKeepsTheStepsInput(t *testing.T) {
	pol := policy.Type{Steps: []policy.Step{
		{Name: "plan"},
		{Name: "implement"},
		{Name: "validate", Run: "command", OnFail: policy.OnFail{Goto: []policy.Goto{{Step: "implement", Max: 2}}}},
		{Name: "test", Run: "command", OnFail: policy.OnFail{Goto: []policy.Goto{{Step: "implement", Max: 1}, {Step: "plan", Max: 1}}}},
	}}
	st := events.TaskState{ID: "t", Pass: 1, Step: "plan"}
	run := events.Run{Pass: 1, Attempt: 1, Step: "plan"}
	step := func(res events.Result) events.Run {
		t.Helper()
		task.Apply(&st, events.Task{ID: "t"}, run, res, pol, now)
		run = task.NextRun(&st, run, res, pol)
		return run
	}
	plan := events.Result{Outcome: events.OutcomeSuccess, Approach: "two phases", Summary: "parse, then render"}
	if next := step(plan); next.Step != "implement" || next.StepInput == "" {
		t.Fatalf("after plan: %+v", next)
	}
	planned := run.StepInput
	step(events.Result{Outcome: events.OutcomeSuccess, Approach: "wrote it", Summary: "render.go"})
	next := step(failed(events.ErrorClassStep, "vet: render.go:3: unused variable"))
	if next.Step != "implement" || next.StepInput != planned || next.Context == "" {
		t.Fatalf("back to implement: step %q input %q context %q; want the plan %q and the error", next.Step, next.StepInput, next.Context, planned)
	}
	step(events.Result{Outcome: events.OutcomeSuccess, Approach: "fixed it", Summary: "render.go"})
	step(events.Result{Outcome: events.OutcomeSuccess, Summary: "vet ok"})
	next = step(failed(events.ErrorClassStep, "--- FAIL: TestRender"))
	if next.Step != "implement" || next.StepInput != planned {
		t.Fatalf("test back to implement: step %q input %q; want the plan %q", next.Step, next.StepInput, planned)
	}
	st = task.Act(st, events.Action{TaskID: "t", Action: events.ActionRequeue, By: "alice", Note: "n", At: now})
	if got := task.StepInput(st, st.Step); st.Step != "implement" || got != planned {
		t.Fatalf("requeued on step %q with input %q; want implement with the plan %q", st.Step, got, planned)
	}
}

// PIVOT judges an answer against the dead ends its prompt showed (the run
// carries them): not against older ones the budget left out — the model
// was never told of those — and, for a task that starts on PIVOT because
// its subject keeps failing, against the subject's failed approaches,
// which the task then keeps for its later attempts.
func TestPivotJudgesTheDeadEndsItWasShown(t *testing.T) {
	pivot := func(attempt int, shown ...events.DeadEnd) events.Base {
		return events.Base{Task: cssTask(), Run: events.Run{Pass: attempt, Attempt: attempt, Rung: events.RungPivot, DeadEnds: shown}, At: t1}
	}
	answer := func(approach string) events.Result {
		return events.Result{Outcome: events.OutcomeSuccess, Approach: approach, Summary: "done"}
	}
	old := events.DeadEnd{Approach: "bump the timeout", Reason: "still slow", Attempt: 1, Rung: events.RungRefine}
	newer := []events.DeadEnd{
		{Approach: "cache the result", Reason: "stale", Attempt: 2, Rung: events.RungRefine},
		{Approach: "retry the call", Reason: "same error", Attempt: 3, Rung: events.RungPivot},
	}
	st := at(events.StatusRunning, 4)
	st.Attempts, st.DeadEnds = 3, append([]events.DeadEnd{old}, newer...)

	if _, res, _ := task.Record(st, true, pivot(4, newer...), answer("Bump the timeout"), policy.Type{}, t1); res.Outcome != events.OutcomeSuccess {
		t.Errorf("an approach the prompt did not show was rejected: %s", res.Error)
	}
	if _, res, _ := task.Record(st, true, pivot(4, newer...), answer("cache the result!"), policy.Type{}, t1); res.ErrorClass != events.ErrorClassDeadEnd {
		t.Errorf("a shown dead end repeated: %+v, want it rejected", res)
	}

	// a recurring start: the subject's failed approaches, an earlier task's
	earlier := events.DeadEnd{Approach: "add !important", Reason: "still overlaps", Rung: events.RungRefine}
	fresh := at(events.StatusRunning, 1)
	next, res, _ := task.Record(fresh, true, pivot(1, earlier), answer("Add !important"), policy.Type{}, t1)
	if res.ErrorClass != events.ErrorClassDeadEnd || next.Decision != events.DecisionRetry {
		t.Fatalf("a recurring start repeated the subject's dead end: %+v, decision %s; want it rejected", res, next.Decision)
	}
	if !strings.Contains(res.Error, "an earlier task on this subject") {
		t.Errorf("rejection %q, want it to say whose dead end it repeats", res.Error)
	}
	if len(next.DeadEnds) != 1 || next.DeadEnds[0] != earlier {
		t.Errorf("dead ends %+v, want the subject's one kept (the repeat is no new dead end)", next.DeadEnds)
	}
	if run := task.NextRun(&next, pivot(1, earlier).Run, res, policy.Type{}); len(run.DeadEnds) != 1 || run.DeadEnds[0] != earlier {
		t.Errorf("the next run carries %+v, want the subject's dead end", run.DeadEnds)
	}
}

// A failed answer rejected for repeating a dead end keeps what it found
// out: the next prompt's last error carries the attempt's own report after
// the rejection, not the rejection alone.
func TestPivotRejectionKeepsTheAttemptsOwnError(t *testing.T) {
	shown := events.DeadEnd{Approach: "patch the handler", Reason: "not the cause", Attempt: 1, Rung: events.RungRefine}
	run := events.Run{Pass: 2, Attempt: 2, Rung: events.RungPivot, DeadEnds: []events.DeadEnd{shown}}
	res := task.Judge(run, events.Result{Outcome: events.OutcomeFailure, Approach: "Patch the handler",
		Error: "the crash comes from a stale cache entry in the loader"}, run.DeadEnds, false)
	if res.ErrorClass != events.ErrorClassDeadEnd || !strings.HasPrefix(res.Error, "rejected:") ||
		!strings.HasSuffix(res.Error, "the attempt itself failed: the crash comes from a stale cache entry in the loader") {
		t.Fatalf("judged %+v, want the rejection followed by the attempt's own error", res)
	}
}
