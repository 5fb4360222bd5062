package task_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func failed(class events.ErrorClass, why string) events.Result {
	return events.Result{Outcome: events.OutcomeFailure, Approach: "a", Error: why, ErrorClass: class, TokensIn: 10, TokensOut: 5, Cost: 0.01}
}

func ok() events.Result {
	return events.Result{Outcome: events.OutcomeSuccess, Approach: "b", Summary: "fixed", TokensIn: 10, TokensOut: 5}
}

func TestApplyLadder(t *testing.T) {
	bugFix := events.Task{ID: "t", Type: "bug_fix", Subject: "a.go"}
	cases := []struct {
		name     string
		pol      policy.Type
		task     events.Task
		attempts int // failed attempts before this one
		rung     events.Rung
		res      events.Result
		status   events.Status
		decision events.Decision
		next     events.Rung
	}{
		{"success", policy.Type{}, bugFix, 0, events.RungRefine, ok(), events.StatusSucceeded, events.DecisionSucceeded, events.RungRefine},
		{"first failure retries on REFINE", policy.Type{}, bugFix, 0, events.RungRefine, failed(events.ErrorClassTask, "x"), events.StatusPending, events.DecisionRetry, events.RungRefine},
		{"a type's refine_attempts", policy.Type{RefineAttempts: 1}, bugFix, 0, events.RungRefine, failed(events.ErrorClassTask, "x"), events.StatusPending, events.DecisionRetry, events.RungPivot},
		{"task max_retries lowers the type's", policy.Type{MaxRetries: 9}, events.Task{ID: "t", Type: "bug_fix", MaxRetries: 2}, 1, events.RungRefine, failed(events.ErrorClassTask, "x"), events.StatusBlocked, events.DecisionHandoff, events.RungHandoff},
		{"task max_retries cannot raise the type's", policy.Type{MaxRetries: 1}, events.Task{ID: "t", Type: "bug_fix", MaxRetries: 50}, 0, events.RungRefine, failed(events.ErrorClassTask, "x"), events.StatusBlocked, events.DecisionHandoff, events.RungHandoff},
		{"type max_retries", policy.Type{MaxRetries: 1}, bugFix, 0, events.RungRefine, failed(events.ErrorClassTask, "x"), events.StatusBlocked, events.DecisionHandoff, events.RungHandoff},
		{"auth short-circuits", policy.Type{}, bugFix, 0, events.RungRefine, failed(events.ErrorClassAuth, "401"), events.StatusBlocked, events.DecisionHandoff, events.RungHandoff},
		{"quota short-circuits", policy.Type{}, bugFix, 0, events.RungRefine, failed(events.ErrorClassQuota, "insufficient_quota"), events.StatusBlocked, events.DecisionHandoff, events.RungHandoff},
		{"over the task budget", policy.Type{Budget: &policy.Budget{Cost: 0.005}}, bugFix, 0, events.RungRefine, failed(events.ErrorClassTask, "x"), events.StatusBlocked, events.DecisionHandoff, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := events.TaskState{ID: "t", Status: events.StatusRunning, Pass: c.attempts + 1}
			for i := range c.attempts {
				st.History = append(st.History, events.AttemptRecord{Attempt: i + 1, Pass: i + 1, Outcome: events.OutcomeFailure})
			}
			run := events.Run{Pass: c.attempts + 1, Attempt: c.attempts + 1, Rung: c.rung}
			task.Apply(&st, c.task, run, c.res, c.pol, now)
			if st.Status != c.status || st.Decision != c.decision || (c.next != "" && st.Rung != c.next) {
				t.Fatalf("status %s decision %s rung %s; want %s %s %s (%s)", st.Status, st.Decision, st.Rung, c.status, c.decision, c.next, st.Reason)
			}
			if c.decision == events.DecisionRetry && st.Pass != run.Pass+1 {
				t.Fatalf("pass %d after a retry decision", st.Pass)
			}
			if len(st.History) != c.attempts+1 || st.Attempts != c.attempts+1 {
				t.Fatalf("history %d attempts %d", len(st.History), st.Attempts)
			}
		})
	}
}

// A task's own max_retries may lower its type's limit, never raise it.
func TestMaxRetries(t *testing.T) {
	for _, c := range []struct {
		name       string
		task, pol  int // max_retries of the task and of its type (0: unset)
		maxRetries int
	}{
		{"neither: the default", 0, 0, policy.DefaultMaxRetries},
		{"the type's", 0, 3, 3},
		{"the task's, lower than the type's", 2, 5, 2},
		{"the task's, equal to the type's", 5, 5, 5},
		{"the task's, higher: the type's", 50, 5, 5},
		{"the task's, lower than the default", 4, 0, 4},
		{"the task's, higher than the default: the default", 1000, 0, policy.DefaultMaxRetries},
		{"a type above the default", 0, 20, 20},
		{"the task's, under a type above the default", 12, 20, 12},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := task.MaxRetries(events.Task{MaxRetries: c.task}, policy.Type{MaxRetries: c.pol})
			if got != c.maxRetries {
				t.Errorf("MaxRetries(task %d, type %d) = %d, want %d", c.task, c.pol, got, c.maxRetries)
			}
		})
	}
}

func TestApplyRequeueStartsANewRound(t *testing.T) {
	st := events.TaskState{ID: "t", Pass: 8, Attempts: 7, RoundStart: 7}
	for i := range 7 {
		st.History = append(st.History, events.AttemptRecord{Attempt: i + 1, Pass: i + 1, Outcome: events.OutcomeFailure})
	}
	task.Apply(&st, events.Task{ID: "t"}, events.Run{Pass: 8, Attempt: 8, Rung: events.RungRefine}, failed(events.ErrorClassTask, "x"), policy.Type{}, now)
	if st.Decision != events.DecisionRetry {
		t.Fatalf("the first attempt after a requeue handed off: %s", st.Reason)
	}
}

func TestApplyPipeline(t *testing.T) {
	pol := policy.Type{Steps: []policy.Step{
		{Name: "implement"},
		{Name: "validate", Run: "command", OnFail: policy.OnFail{Goto: []policy.Goto{{Step: "implement", Max: 1}}, Final: "skip"}},
	}, SkipBudget: 1}
	st := events.TaskState{ID: "t", Pass: 1}
	step := func(name string, res events.Result) {
		run := events.Run{Pass: st.Pass, Attempt: st.Attempts + 1, Step: name}
		task.Apply(&st, events.Task{ID: "t"}, run, res, pol, now)
	}
	step("implement", ok())
	if st.Decision != events.DecisionRetry || st.Step != "validate" {
		t.Fatalf("after implement: %s %s", st.Decision, st.Step)
	}
	next := task.NextRun(&st, events.Run{Step: "implement"}, ok(), pol)
	if next.Step != "validate" || !strings.Contains(next.StepInput, "step implement passed") || next.Context != "" {
		t.Fatalf("next run %+v", next)
	}
	step("validate", failed(events.ErrorClassStep, "vet: x.go:3: unused variable"))
	next = task.NextRun(&st, events.Run{Step: "validate"}, failed(events.ErrorClassStep, "vet: x.go:3: unused variable"), pol)
	if st.Step != "implement" || !strings.Contains(next.Context, "vet: x.go:3") {
		t.Fatalf("validate failure went to %s with %q", st.Step, next.Context)
	}
	step("implement", ok())
	step("validate", failed(events.ErrorClassStep, "still"))
	if st.Decision != events.DecisionPark || st.Status != events.StatusParked || !st.WakeAt.Equal(now.Add(task.DefaultSkipDelay)) || st.Step != "implement" {
		t.Fatalf("loops exhausted: %s %s wake %s step %s", st.Decision, st.Status, st.WakeAt, st.Step)
	}
	step("implement", ok())
	step("validate", failed(events.ErrorClassStep, "still"))
	step("implement", ok())
	step("validate", failed(events.ErrorClassStep, "still"))
	if st.Decision != events.DecisionStuck || st.Status != events.StatusBlocked {
		t.Fatalf("after the skip budget: %s %s (%s)", st.Decision, st.Status, st.Reason)
	}
	if st.Decision == events.DecisionStuck && st.Skips != 1 {
		t.Fatalf("skips = %d", st.Skips)
	}
}

func TestJudgeRejectsRepeatedDeadEndOnPivot(t *testing.T) {
	ends := []events.DeadEnd{{Approach: "Bump the timeout", Attempt: 2, Rung: events.RungRefine, Reason: "still slow"}}
	res := events.Result{Outcome: events.OutcomeSuccess, Approach: "bump the timeout!"}
	if got := task.Judge(events.Run{Rung: events.RungRefine}, res, ends, false); got.Outcome != events.OutcomeSuccess {
		t.Fatal("REFINE may keep its approach")
	}
	got := task.Judge(events.Run{Rung: events.RungPivot}, res, ends, false)
	if got.Outcome != events.OutcomeFailure || got.ErrorClass != events.ErrorClassDeadEnd || !strings.Contains(got.Error, "attempt 2") {
		t.Fatalf("judged %+v", got)
	}
	if got := task.Judge(events.Run{Rung: events.RungPivot}, events.Result{Outcome: events.OutcomeSuccess, Approach: "cache the result"}, ends, false); got.Outcome != events.OutcomeSuccess {
		t.Fatal("a new approach was rejected")
	}
}

func TestDailySpend(t *testing.T) {
	res := events.Result{TokensIn: 100, TokensOut: 20, Cost: 0.5}
	for _, tt := range []struct {
		name   string
		budget *policy.Budget
		tokens int
		cost   float64
	}{
		{"no budget: nothing counted", nil, 0, 0},
		{"tokens capped", &policy.Budget{Tokens: 10}, 120, 0},
		{"cost capped", &policy.Budget{Cost: 1}, 0, 0.5},
		{"both capped", &policy.Budget{Tokens: 10, Cost: 1}, 120, 0.5},
	} {
		if tokens, cost := task.DailySpend(res, tt.budget); tokens != tt.tokens || cost != tt.cost {
			t.Errorf("%s: %d tokens, $%g; want %d, $%g", tt.name, tokens, cost, tt.tokens, tt.cost)
		}
	}
}

// A step retried after it fails keeps the input the previous step handed
// it; a step gone back to gets the failure as its context instead.
func TestNextRunKeepsAStepsInputOnItsRetry(t *testing.T) {
	pol := policy.Type{Steps: []policy.Step{{Name: "plan"}, {Name: "implement"}}}
	st := events.TaskState{ID: "t", Pass: 2, Attempts: 1}
	run := events.Run{Pass: 2, Attempt: 2, Step: "implement", StepInput: "step plan passed: two phases"}
	task.Apply(&st, events.Task{ID: "t"}, run, failed(events.ErrorClassTask, "does not compile"), pol, now)
	next := task.NextRun(&st, run, failed(events.ErrorClassTask, "does not compile"), pol)
	if next.Step != "implement" || next.StepInput != run.StepInput || !strings.Contains(next.Context, "does not compile") {
		t.Fatalf("the retry of implement: %+v", next)
	}
}

// A re-admitted held task's retries, and their outcomes, still measure
// the held backlog: the mark goes with the ladder and into the trust
// outcome (scoring.Outcome.Held).
func TestReadmittedGoesWithTheLadder(t *testing.T) {
	st := events.TaskState{ID: "t", Pass: 1}
	run := events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Readmitted: true}
	res := failed(events.ErrorClassTask, "does not compile")
	task.Apply(&st, events.Task{ID: "t"}, run, res, policy.Type{}, now)
	if next := task.NextRun(&st, run, res, policy.Type{}); !next.Readmitted {
		t.Fatalf("the retry of a re-admitted task: %+v, not marked re-admitted", next)
	}
	if o := task.TrustOutcome("t:1:outcome", st, run, res, now); !o.Held {
		t.Fatalf("its outcome %+v is not marked held", o)
	}
	if o := task.TrustOutcome("t:1:outcome", st, events.Run{Pass: 1, Attempt: 1}, res, now); o.Held {
		t.Fatalf("a new task's outcome %+v is marked held", o)
	}
}

// A task a human requeued round after round keeps every attempt of its
// current round and the newest KeepEarlierAttempts of the rounds before:
// its state stays storable however often it is requeued.
func TestKeptAttempts(t *testing.T) {
	attempts := func(from, to int) []events.AttemptRecord {
		var h []events.AttemptRecord
		for a := from; a <= to; a++ {
			h = append(h, events.AttemptRecord{Attempt: a, Pass: a})
		}
		return h
	}
	k := task.KeepEarlierAttempts
	for _, tt := range []struct {
		name       string
		history    []events.AttemptRecord
		roundStart int
		first      int // attempt of the first record kept
	}{
		{"one round", attempts(1, 7), 0, 1},
		{"earlier rounds within the limit", attempts(1, k+3), k, 1},
		{"earlier rounds past it", attempts(1, k+10), k + 7, 8},
		{"a current round longer than the limit", attempts(1, 3*k), 0, 1},
		{"empty", nil, 5, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := task.KeptAttempts(tt.history, tt.roundStart)
			if len(tt.history) == 0 {
				if len(got) != 0 {
					t.Fatalf("kept %v", got)
				}
				return
			}
			last := tt.history[len(tt.history)-1].Attempt
			if got[0].Attempt != tt.first || got[len(got)-1].Attempt != last || len(got) != last-tt.first+1 {
				t.Fatalf("kept attempts %d-%d (%d), want %d-%d", got[0].Attempt, got[len(got)-1].Attempt, len(got), tt.first, last)
			}
		})
	}
	// Through Apply: the 30th requeue's first attempt leaves 16 earlier.
	st := events.TaskState{ID: "t", Pass: 31, Attempts: 30, RoundStart: 30, History: attempts(1, 30)}
	task.Apply(&st, events.Task{ID: "t"}, events.Run{Pass: 31, Attempt: 31, Rung: events.RungRefine}, failed(events.ErrorClassTask, "x"), policy.Type{}, now)
	if len(st.History) != k+1 || st.History[0].Attempt != 30-k+1 || st.Attempts != 31 {
		t.Fatalf("kept %d records from attempt %d, %d attempts counted", len(st.History), st.History[0].Attempt, st.Attempts)
	}
}
