package task_test

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

var (
	t0 = time.Date(2026, 11, 22, 11, 0, 0, 0, time.UTC)
	t1 = t0.Add(time.Minute)
)

func cssTask() events.Task {
	return events.Task{ID: "t", Type: "css_fix", Subject: "a.css", SubmittedAt: t0}
}

func base(pass int) events.Base {
	return events.Base{Task: cssTask(), Run: events.Run{Pass: pass, Attempt: pass, Rung: events.RungRefine}, At: t1}
}

// at is a stored state of the task: status on pass.
func at(status events.Status, pass int) events.TaskState {
	st := task.New(cssTask())
	st.Status, st.Pass = status, pass
	return st
}

// transition is one row of the table: a transition applied to a state.
type transition struct {
	name  string
	st    events.TaskState
	found bool
	do    func(st events.TaskState, found bool) (events.TaskState, task.Cause)
	cause task.Cause
	check func(t *testing.T, st events.TaskState)
}

func status(want events.Status) func(*testing.T, events.TaskState) {
	return func(t *testing.T, st events.TaskState) {
		t.Helper()
		if st.Status != want {
			t.Errorf("status %s, want %s", st.Status, want)
		}
	}
}

func run(t *testing.T, tests []transition) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := clone(tt.st)
			got, cause := tt.do(tt.st, tt.found)
			if cause != tt.cause || !cause.Valid() {
				t.Fatalf("cause %q, want %q", cause, tt.cause)
			}
			if !reflect.DeepEqual(tt.st, before) {
				t.Fatalf("the transition wrote through its input:\n%+v\nwas\n%+v", tt.st, before)
			}
			if !cause.Changed() && tt.found && !reflect.DeepEqual(got, tt.st) {
				t.Fatalf("no change (%s), but the state differs:\n%+v\nwas\n%+v", cause, got, tt.st)
			}
			if tt.check != nil {
				tt.check(t, got)
			}
		})
	}
}

// clone is a deep copy of st: run compares the input with it after the
// transition, so a write through a shared slice, map or Resume shows.
// (A service may start a transition from a state it already knows —
// kvcas.UpdateFrom — and keeps the input if the transition changes
// nothing: a transition must never write through what it is given.)
func clone(st events.TaskState) events.TaskState {
	st.History = slices.Clone(st.History)
	st.DeadEnds = slices.Clone(st.DeadEnds)
	st.FailedRequests = slices.Clone(st.FailedRequests)
	st.Actions = slices.Clone(st.Actions)
	st.StepRetries = maps.Clone(st.StepRetries)
	st.Loops = maps.Clone(st.Loops)
	st.StepInputs = maps.Clone(st.StepInputs)
	if st.Resume != nil {
		r := *st.Resume
		r.Turns, r.Pending = slices.Clone(r.Turns), slices.Clone(r.Pending)
		st.Resume = &r
	}
	return st
}

func TestNewAndQueued(t *testing.T) {
	st := task.New(cssTask())
	want := events.TaskState{ID: "t", Type: "css_fix", Subject: "a.css", Status: events.StatusPending, Pass: 1, CreatedAt: t0, UpdatedAt: t0}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("New = %+v, want %+v", st, want)
	}
	q := task.Queued(cssTask(), events.Run{Pass: 1, Attempt: 1, Rung: events.RungPivot, Step: "plan"}, 42)
	want.Rung, want.Step, want.SubmitSeq = events.RungPivot, "plan", 42
	if !reflect.DeepEqual(q, want) {
		t.Fatalf("Queued = %+v, want %+v", q, want)
	}
}

func TestVerifierTransitions(t *testing.T) {
	stale := events.Verification{Verdict: events.VerdictStale, Detail: "fixed in abc"}
	failed := events.Verification{Verdict: events.VerdictError, Detail: "exit 3"}
	verifying := func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.Verifying(st, found, base(2))
	}
	cancel := func(v events.Verification) func(events.TaskState, bool) (events.TaskState, task.Cause) {
		return func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Cancel(st, found, base(2), v)
		}
	}
	run(t, []transition{
		{"verifying: an unknown task is created", events.TaskState{}, false, verifying, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.ID != "t" || st.Status != events.StatusVerifying || st.Pass != 2 || !st.UpdatedAt.Equal(t1) || !st.CreatedAt.Equal(t0) {
				t.Errorf("state %+v", st)
			}
		}},
		{"verifying: the next pass", at(events.StatusPending, 2), true, verifying, task.CauseApplied, status(events.StatusVerifying)},
		{"verifying: a redelivery", at(events.StatusVerifying, 2), true, verifying, task.CauseRedelivered, nil},
		{"verifying: an old pass", at(events.StatusRunning, 3), true, verifying, task.CauseMovedOn, nil},
		{"verifying: an ended task", at(events.StatusSucceeded, 1), true, verifying, task.CauseEnded, nil},
		{"stale cancels with the detail", at(events.StatusVerifying, 2), true, cancel(stale), task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Status != events.StatusCancelled || st.Reason != "stale: fixed in abc" {
				t.Errorf("state %s %q", st.Status, st.Reason)
			}
		}},
		{"fail-closed cancels with the error", at(events.StatusVerifying, 2), true, cancel(failed), task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Reason != "verifier error (fail-closed): exit 3" {
				t.Errorf("reason %q", st.Reason)
			}
		}},
		{"a cancel redelivered", at(events.StatusCancelled, 2), true, cancel(stale), task.CauseEnded, nil},
		{"a cancel of an old pass", at(events.StatusPending, 3), true, cancel(stale), task.CauseMovedOn, nil},
	})
}

func TestGateTransitions(t *testing.T) {
	block := func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.Block(st, found, base(2), "Blocked: css_fix trust score 0.08 below 0.15", events.CauseTrust)
	}
	handoff := func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.HandOff(st, found, base(2), "PIVOT rarely succeeds")
	}
	run(t, []transition{
		{"block", at(events.StatusVerifying, 2), true, block, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Status != events.StatusNeedsHumanReview || st.Cause != events.CauseTrust || st.Pass != 2 || !st.UpdatedAt.Equal(t1) ||
				st.Reason != "Blocked: css_fix trust score 0.08 below 0.15" {
				t.Errorf("state %+v", st)
			}
		}},
		{"block an unknown task", events.TaskState{}, false, block, task.CauseApplied, status(events.StatusNeedsHumanReview)},
		{"block redelivered", at(events.StatusNeedsHumanReview, 2), true, block, task.CauseEnded, nil},
		{"block an old pass", at(events.StatusRunning, 3), true, block, task.CauseMovedOn, nil},
		{"handoff", at(events.StatusVerifying, 2), true, handoff, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Status != events.StatusBlocked || st.Decision != events.DecisionHandoff || st.Rung != events.RungHandoff ||
				st.Cause != events.CauseRungRate || st.Reason != "PIVOT rarely succeeds" || st.Pass != 2 {
				t.Errorf("state %+v", st)
			}
		}},
		{"handoff of a cancelled task", at(events.StatusCancelled, 2), true, handoff, task.CauseEnded, nil},
	})
}

func TestExecutorTransitions(t *testing.T) {
	resume := &events.Resume{Pass: 1, Turns: []events.Turn{{Role: "assistant"}}}
	withResume := func(st events.TaskState, r *events.Resume) events.TaskState { st.Resume = r; return st }
	withFacts := func(st events.TaskState) events.TaskState {
		st.TransientRetries, st.Unbilled, st.Resume = 2, events.Usage{TokensIn: 5}, resume
		return st
	}
	begin := func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.Begin(st, found, base(2))
	}
	b := base(2)
	run(t, []transition{
		{"begin", at(events.StatusVerifying, 2), true, begin, task.CauseApplied, status(events.StatusRunning)},
		{"begin an unknown task", events.TaskState{}, false, begin, task.CauseApplied, status(events.StatusRunning)},
		{"begin redelivered", at(events.StatusRunning, 2), true, begin, task.CauseRedelivered, nil},
		{"begin an old pass", at(events.StatusVerifying, 3), true, begin, task.CauseMovedOn, nil},
		{"begin a cancelled task", at(events.StatusCancelled, 2), true, begin, task.CauseEnded, nil},
		{"begin drops an earlier pass's loop", withResume(at(events.StatusRunning, 2), resume), true, begin, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Resume != nil || st.Status != events.StatusRunning {
				t.Errorf("resume %v, status %s", st.Resume, st.Status)
			}
		}},
		{"begin keeps this pass's loop", withResume(at(events.StatusRunning, 2), &events.Resume{Pass: 2}), true, begin, task.CauseRedelivered, nil},
		{"cut short, transient", at(events.StatusRunning, 2), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.CutShort(st, found, b, events.Usage{TokensIn: 3, Cost: 0.5}, resume, true)
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.TransientRetries != 1 || st.Unbilled != (events.Usage{TokensIn: 3, Cost: 0.5}) || st.Resume != resume {
				t.Errorf("state %+v", st)
			}
		}},
		{"cut short by a tool", withFacts(at(events.StatusRunning, 2)), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.CutShort(st, found, b, events.Usage{TokensIn: 1}, nil, false)
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.TransientRetries != 2 || st.Unbilled.TokensIn != 6 || st.Resume != nil {
				t.Errorf("state %+v", st)
			}
		}},
		{"settle: the unbilled spend stays until the Result is recorded", withFacts(at(events.StatusRunning, 2)), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Settle(st, found, b)
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.TransientRetries != 0 || st.Unbilled != (events.Usage{TokensIn: 5}) || st.Resume != nil {
				t.Errorf("state %+v", st)
			}
		}},
		{"settle, only unbilled spend: nothing to settle", func() events.TaskState {
			st := at(events.StatusRunning, 2)
			st.Unbilled = events.Usage{TokensIn: 5}
			return st
		}(), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Settle(st, found, b)
		}, task.CauseRedelivered, nil},
		{"settle, nothing to settle", at(events.StatusRunning, 2), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Settle(st, found, b)
		}, task.CauseRedelivered, nil},
		{"abandoned: the attempt's spend stays unbilled, a cancelled task keeps no loop", withFacts(at(events.StatusCancelled, 2)), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Abandon(st, found, b, events.Usage{TokensIn: 9, TokensOut: 4, Cost: 0.25})
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Status != events.StatusCancelled || st.Unbilled != (events.Usage{TokensIn: 9, TokensOut: 4, Cost: 0.25}) || st.Resume != nil || st.TransientRetries != 2 {
				t.Errorf("state %+v", st)
			}
		}},
		{"abandoned after the attempt settled", at(events.StatusCancelled, 2), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Abandon(st, found, b, events.Usage{TokensIn: 9})
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Unbilled != (events.Usage{TokensIn: 9}) {
				t.Errorf("state %+v", st)
			}
		}},
		{"abandoned, the spend already kept", withResume(func() events.TaskState {
			st := at(events.StatusCancelled, 2)
			st.Unbilled = events.Usage{TokensIn: 9}
			return st
		}(), nil), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Abandon(st, found, b, events.Usage{TokensIn: 9})
		}, task.CauseRedelivered, nil},
		{"abandoned by a cancel that did not take: the loop stays to resume", withFacts(at(events.StatusRunning, 2)), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Abandon(st, found, b, events.Usage{TokensIn: 7})
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Unbilled != (events.Usage{TokensIn: 7}) || st.Resume != resume || st.Status != events.StatusRunning {
				t.Errorf("state %+v", st)
			}
		}},
		{"abandoned, the task moved on", withFacts(at(events.StatusRunning, 3)), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Abandon(st, found, b, events.Usage{TokensIn: 7})
		}, task.CauseMovedOn, nil},
		{"a failed request is banned for its pass", at(events.StatusRunning, 2), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.AddFailed(st, found, b, "h1", events.ErrorClassDeterministic)
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if !slices.Equal(st.FailedRequests, []string{"h1@2"}) {
				t.Errorf("failed %v", st.FailedRequests)
			}
		}},
		{"a ban redelivered", func() events.TaskState {
			st := at(events.StatusRunning, 2)
			st.FailedRequests = []string{"h1@2"}
			return st
		}(), true,
			func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
				return task.AddFailed(st, found, b, "h1", events.ErrorClassDeterministic)
			}, task.CauseRedelivered, nil},
		{"an auth failure is banned with its class", at(events.StatusRunning, 2), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.AddFailed(st, found, b, "h1", events.ErrorClassAuth)
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if !slices.Equal(st.FailedRequests, []string{"h1@2/auth"}) {
				t.Errorf("failed %v", st.FailedRequests)
			}
		}},
		{"a ban with its class redelivered", func() events.TaskState {
			st := at(events.StatusRunning, 2)
			st.FailedRequests = []string{"h1@2/auth"}
			return st
		}(), true,
			func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
				return task.AddFailed(st, found, b, "h1", events.ErrorClassAuth)
			}, task.CauseRedelivered, nil},
		{"a refusal is counted", at(events.StatusRunning, 2), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.AddRefused(st, found, b)
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Refused != 1 || st.RefusedPass != 2 {
				t.Errorf("refused %d in pass %d", st.Refused, st.RefusedPass)
			}
		}},
		{"a pass's refusal delivered again is counted once", func() events.TaskState {
			st := at(events.StatusRunning, 2)
			st.Refused, st.RefusedPass = 1, 2
			return st
		}(), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.AddRefused(st, found, b)
		}, task.CauseRedelivered, nil},
		{"executed: refused", at(events.StatusRunning, 2), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Executed(st, found, b, events.Result{Refused: true, RequestHash: "h1", ErrorClass: events.ErrorClassRefused})
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Refused != 1 || st.FailedRequests != nil {
				t.Errorf("state %+v", st)
			}
		}},
		{"executed: deterministic failure bans", at(events.StatusRunning, 2), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Executed(st, found, b, events.Result{RequestHash: "h2", ErrorClass: events.ErrorClassDeterministic})
		}, task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if !slices.Equal(st.FailedRequests, []string{"h2@2"}) {
				t.Errorf("failed %v", st.FailedRequests)
			}
		}},
		{"executed: a task failure bans nothing", at(events.StatusRunning, 2), true, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Executed(st, found, b, events.Result{RequestHash: "h3", ErrorClass: events.ErrorClassTask})
		}, task.CauseRedelivered, nil},
	})
}

func TestBans(t *testing.T) {
	for class, want := range map[events.ErrorClass]bool{
		events.ErrorClassDeterministic: true, events.ErrorClassAuth: true, events.ErrorClassQuota: true, events.ErrorClassConfig: true,
		events.ErrorClassTransient: false, events.ErrorClassTask: false, events.ErrorClassRefused: false, "": false,
	} {
		if got := task.Bans(class); got != want {
			t.Errorf("Bans(%q) = %v, want %v", class, got, want)
		}
	}
}

func TestRecordTransitions(t *testing.T) {
	ends := []events.DeadEnd{{Approach: "add a null check", Reason: "wrong place", Attempt: 1, Rung: events.RungRefine}}
	pivot := base(3)
	pivot.Run.Rung, pivot.Run.DeadEnds = events.RungPivot, ends // as its prompt showed them
	withEnds := func(st events.TaskState) events.TaskState {
		st.DeadEnds = ends
		return st
	}
	recorded := func(st events.TaskState) events.TaskState {
		st.History = []events.AttemptRecord{{Attempt: 2, Pass: 2, Outcome: events.OutcomeFailure, Reason: "first judgement", ErrorClass: events.ErrorClassDeadEnd}}
		return st
	}
	record := func(b events.Base, res events.Result, want func(*testing.T, events.Result)) func(events.TaskState, bool) (events.TaskState, task.Cause) {
		return func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			next, judged, c := task.Record(st, found, b, res, policy.Type{}, t1)
			if want != nil {
				want(nil, judged)
			}
			return next, c
		}
	}
	var judged events.Result
	keep := func(_ *testing.T, r events.Result) { judged = r }
	pipeline := policy.Type{Steps: []policy.Step{
		{Name: "implement"},
		{Name: "validate", Run: "command", OnFail: policy.OnFail{Goto: []policy.Goto{{Step: "implement", Max: 2}}}},
	}}
	// inPipeline puts the task on step with retries and loops already
	// counted (maps a transition must not write through).
	inPipeline := func(st events.TaskState, step string) events.TaskState {
		st.Step = step
		st.StepRetries = map[string]int{"implement": 1}
		st.Loops = map[string]int{"other>implement": 1}
		st.StepInputs = map[string]string{"implement": "step plan passed"}
		return st
	}
	stepBase := func(pass int, step string) events.Base {
		b := base(pass)
		b.Run.Rung, b.Run.Step = "", step
		return b
	}
	recordIn := func(pol policy.Type, b events.Base, res events.Result) func(events.TaskState, bool) (events.TaskState, task.Cause) {
		return func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			next, _, c := task.Record(st, found, b, res, pol, t1)
			return next, c
		}
	}
	run(t, []transition{
		{"a success", at(events.StatusRunning, 2), true, record(base(2), ok(), nil), task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Status != events.StatusSucceeded || st.Decision != events.DecisionSucceeded || len(st.History) != 1 || !st.History[0].At.Equal(t1) {
				t.Errorf("state %+v", st)
			}
		}},
		{"a failure retries on the next pass", at(events.StatusRunning, 2), true, record(base(2), failed(events.ErrorClassTask, "red"), nil), task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Status != events.StatusPending || st.Decision != events.DecisionRetry || st.Pass != 3 || st.LastError != "red" {
				t.Errorf("state %+v", st)
			}
		}},
		{"the Result bills what the attempt's cut-short tries spent", func() events.TaskState {
			st := at(events.StatusRunning, 2)
			st.Unbilled = events.Usage{TokensIn: 120, TokensOut: 30, Cost: 0.5}
			return st
		}(), true, record(base(2), events.Result{Outcome: events.OutcomeSuccess, TokensIn: 220, TokensOut: 60, Cost: 1}, nil), task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.Unbilled != (events.Usage{}) || st.TokensIn != 220 || st.TokensOut != 60 || st.Cost != 1 {
				t.Errorf("state %+v, want the unbilled spend billed by the Result once", st)
			}
		}},
		{"an outcome of an unknown task", events.TaskState{}, false, record(base(1), ok(), nil), task.CauseApplied, func(t *testing.T, st events.TaskState) {
			if st.ID != "t" || st.Status != events.StatusSucceeded || !st.CreatedAt.Equal(t0) {
				t.Errorf("state %+v", st)
			}
		}},
		{"a redelivery keeps the first judgement", recorded(at(events.StatusPending, 3)), true, record(base(2), ok(), keep), task.CauseRedelivered, func(t *testing.T, _ events.TaskState) {
			if judged.Outcome != events.OutcomeFailure || judged.Error != "first judgement" || judged.ErrorClass != events.ErrorClassDeadEnd {
				t.Errorf("judged %+v", judged)
			}
		}},
		{"an old pass", at(events.StatusRunning, 4), true, record(base(2), ok(), nil), task.CauseMovedOn, nil},
		{"a task cancelled meanwhile", at(events.StatusCancelled, 2), true, record(base(2), ok(), nil), task.CauseEnded, nil},
		{"a pipeline step fails: its retries counted", inPipeline(at(events.StatusRunning, 2), "implement"), true,
			recordIn(pipeline, stepBase(2, "implement"), failed(events.ErrorClassTask, "red")), task.CauseApplied,
			func(t *testing.T, st events.TaskState) {
				if st.Decision != events.DecisionRetry || st.StepRetries["implement"] != 2 {
					t.Errorf("state %+v", st)
				}
			}},
		{"a pipeline step that times out follows its on_fail too", inPipeline(at(events.StatusRunning, 2), "validate"), true,
			recordIn(pipeline, stepBase(2, "validate"), failed(events.ErrorClassTimeout, "go test timed out after 5m")), task.CauseApplied,
			func(t *testing.T, st events.TaskState) {
				if st.Decision != events.DecisionRetry || st.Step != "implement" || st.Loops["validate>implement"] != 1 {
					t.Errorf("state %+v", st)
				}
			}},
		{"a pipeline step the deployment failed goes to a human", inPipeline(at(events.StatusRunning, 2), "implement"), true,
			recordIn(pipeline, stepBase(2, "implement"), failed(events.ErrorClassAuth, "401: invalid key")), task.CauseApplied,
			func(t *testing.T, st events.TaskState) {
				if st.Decision != events.DecisionHandoff || st.Status != events.StatusBlocked {
					t.Errorf("state %+v", st)
				}
			}},
		{"a pipeline check fails: back to an earlier step", inPipeline(at(events.StatusRunning, 2), "validate"), true,
			recordIn(pipeline, stepBase(2, "validate"), failed(events.ErrorClassStep, "vet: unused")), task.CauseApplied,
			func(t *testing.T, st events.TaskState) {
				if st.Step != "implement" || st.Loops["validate>implement"] != 1 {
					t.Errorf("state %+v", st)
				}
			}},
		{"a pipeline step passes", inPipeline(at(events.StatusRunning, 2), "implement"), true,
			recordIn(pipeline, stepBase(2, "implement"), ok()), task.CauseApplied,
			func(t *testing.T, st events.TaskState) {
				if st.Step != "validate" || !strings.HasPrefix(st.StepInputs["validate"], "step implement passed") || st.StepInputs["implement"] != "step plan passed" {
					t.Errorf("state %+v", st)
				}
			}},
		{"PIVOT rejects a dead end", withEnds(at(events.StatusRunning, 3)), true,
			record(pivot, events.Result{Outcome: events.OutcomeSuccess, Approach: "Add a null check"}, keep), task.CauseApplied,
			func(t *testing.T, st events.TaskState) {
				if judged.Outcome != events.OutcomeFailure || judged.ErrorClass != events.ErrorClassDeadEnd ||
					st.Decision != events.DecisionRetry || len(st.DeadEnds) != 1 {
					t.Errorf("judged %+v; state %+v", judged, st)
				}
			}},
	})
}

func TestAct(t *testing.T) {
	running := at(events.StatusRunning, 2)
	running.Resume, running.WakeAt = &events.Resume{Pass: 2}, t1
	blocked := at(events.StatusBlocked, 3)
	blocked.Attempts, blocked.Decision, blocked.Cause, blocked.Rung, blocked.Reason = 7, events.DecisionHandoff, events.CauseRungRate, events.RungHandoff, "HANDOFF"
	blocked.Skips, blocked.StepRetries, blocked.Loops = 1, map[string]int{"plan": 1}, map[string]int{"a>b": 1}
	act := func(action, note string) events.Action {
		return events.Action{TaskID: "t", Action: action, By: "alice", Note: note, At: t1}
	}
	tests := []struct {
		name   string
		st     events.TaskState
		a      events.Action
		status events.Status
		reason string
		check  func(t *testing.T, st events.TaskState)
	}{
		{"resolve", blocked, act(events.ActionResolve, "fixed by hand"), events.StatusSucceeded, "resolved by alice: fixed by hand", nil},
		{"reject", blocked, act(events.ActionReject, ""), events.StatusFailed, "rejected by alice", nil},
		{"cancel", running, act(events.ActionCancel, "not needed"), events.StatusCancelled, "cancelled by alice: not needed", func(t *testing.T, st events.TaskState) {
			if st.Resume != nil || !st.WakeAt.IsZero() {
				t.Errorf("resume %v, wake %v", st.Resume, st.WakeAt)
			}
		}},
		{"requeue starts a new round", blocked, act(events.ActionRequeue, "try the parser"), events.StatusPending, "", func(t *testing.T, st events.TaskState) {
			if st.Pass != 4 || st.RoundStart != 7 || st.Rung != events.RungRefine || st.Decision != "" || st.Cause != "" ||
				st.Skips != 0 || st.StepRetries != nil || st.Loops != nil {
				t.Errorf("state %+v", st)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := clone(tt.st)
			st := task.Act(tt.st, tt.a)
			if !reflect.DeepEqual(tt.st, before) {
				t.Fatal("Act wrote through its input")
			}
			if st.Status != tt.status || st.Reason != tt.reason || !st.UpdatedAt.Equal(t1) || len(st.Actions) != 1 || st.Actions[0] != tt.a {
				t.Fatalf("state %s %q %v", st.Status, st.Reason, st.Actions)
			}
			if !task.EndedByHuman(st) != (tt.a.Action == events.ActionRequeue) {
				t.Errorf("EndedByHuman = %v after %s", task.EndedByHuman(st), tt.a.Action)
			}
			if tt.check != nil {
				tt.check(t, st)
			}
		})
	}
}

func TestParseFailedEntry(t *testing.T) {
	for _, c := range []struct {
		entry string
		hash  string
		pass  int
		class events.ErrorClass
	}{
		{"h1@2", "h1", 2, events.ErrorClassDeterministic},
		{"h1@2/quota", "h1", 2, events.ErrorClassQuota},
		{"tool:h2@3", "tool:h2", 3, events.ErrorClassDeterministic},
		{"h3", "h3", 0, events.ErrorClassDeterministic}, // kept before entries named their pass
	} {
		if hash, pass, class := task.ParseFailedEntry(c.entry); hash != c.hash || pass != c.pass || class != c.class {
			t.Errorf("%q: %q %d %s", c.entry, hash, pass, class)
		}
	}
}
