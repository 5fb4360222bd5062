package task_test

import (
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

func TestEmit(t *testing.T) {
	bugFix := events.Task{ID: "t", Type: "bug_fix", Subject: "a.go"}
	verified := policy.Type{Verifier: &policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"true"}}}
	unverified := policy.Type{}
	cases := []struct {
		name     string
		pol      policy.Type
		decision events.Decision
		stage    string // or
		review   string
		check    func(t *testing.T, e task.Emission)
	}{
		{"success ends the task", verified, events.DecisionSucceeded, events.StageSucceeded, "", func(t *testing.T, e task.Emission) {
			if ev := e.Event.(events.Succeeded); ev.Result.Summary != "fixed" || ev.Base.Run.Pass != 3 {
				t.Fatalf("succeeded %+v", ev)
			}
		}},
		{"a retry starts the next pass with the error as context", verified, events.DecisionRetry, events.StageRetry, "", func(t *testing.T, e task.Emission) {
			ev := e.Event.(events.Retry)
			if e.Base.Run.Pass != 4 || ev.Base.Run.Pass != 4 || ev.Base.Run.Attempt != 4 || ev.Reason != "boom" ||
				ev.Base.Run.Context != "boom" || ev.Base.Run.LastErrorClass != events.ErrorClassTask {
				t.Fatalf("retry %+v", ev)
			}
		}},
		{"a retry of a type without a verifier goes straight to the gate", unverified, events.DecisionRetry, events.StageVerified, "", func(t *testing.T, e task.Emission) {
			ev := e.Event.(events.Verified)
			if ev.Base.Run.Pass != 4 || ev.Reason != "boom" || ev.Base.Run.Context != "boom" ||
				ev.Verification.Verdict != events.VerdictSkipped || ev.Verification.Verifier != policy.VerifierNone || e.Name != events.EventVerified {
				t.Fatalf("verified %+v", ev)
			}
		}},
		{"a park retries with the park's reason, through the verifier that holds it", unverified, events.DecisionPark, events.StageRetry, "", func(t *testing.T, e task.Emission) {
			if ev := e.Event.(events.Retry); ev.Reason != "parked" || !ev.WakeAt.Equal(now) || ev.Base.Run.Rung != "" {
				t.Fatalf("park %+v", ev)
			}
		}},
		{"out of skips is stuck", verified, events.DecisionStuck, "", events.ReviewStuck, func(t *testing.T, e task.Emission) {
			if ev := e.Event.(events.Stuck); ev.Skips != 2 || e.Reason != "stuck" || len(ev.Attempts) != 3 {
				t.Fatalf("stuck %+v", ev)
			}
		}},
		{"a handoff escalates with the trust score and the spend", verified, events.DecisionHandoff, "", events.ReviewEscalated, func(t *testing.T, e task.Emission) {
			if ev := e.Event.(events.Escalated); ev.TrustScore != 0.4 || ev.Cost != 0.03 || ev.TokensIn != 30 || e.Reason != "handed off" {
				t.Fatalf("escalated %+v", ev)
			}
		}},
		{"a failure escalates", verified, events.DecisionFail, "", events.ReviewEscalated, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := events.TaskState{ID: "t", Pass: 4, Attempts: 3, Rung: events.RungRefine, Decision: c.decision,
				Skips: 2, WakeAt: now, TokensIn: 30, TokensOut: 15, Cost: 0.03,
				History: make([]events.AttemptRecord, 3)}
			switch c.decision {
			case events.DecisionPark:
				st.Reason = "parked"
			case events.DecisionStuck:
				st.Reason = "stuck"
			case events.DecisionHandoff, events.DecisionFail:
				st.Reason = "handed off"
			}
			b := events.Base{Task: bugFix, Run: events.Run{Pass: 3, Attempt: 3, Rung: events.RungRefine}}
			res := failed(events.ErrorClassTask, "boom")
			if c.decision == events.DecisionSucceeded {
				res = ok()
			}
			e := task.Emit(st, b, res, c.pol, 0.4)
			if e.Stage != c.stage || e.Review != c.review || e.Name == "" {
				t.Fatalf("stage %q review %q name %q; want %q %q", e.Stage, e.Review, e.Name, c.stage, c.review)
			}
			if c.check != nil {
				c.check(t, e)
			}
		})
	}
}

// A redelivered outcome republishes what its attempt led to only while the
// task is as recording it left it.
func TestAsRecorded(t *testing.T) {
	bugFix := events.Task{ID: "t", Type: "bug_fix", Subject: "a.go"}
	pol := policy.Type{}
	fail := events.Result{Outcome: events.OutcomeFailure, Error: "boom", ErrorClass: events.ErrorClassTask}
	record := func(res events.Result) events.TaskState {
		st, _, c := task.Record(task.New(bugFix), true, events.Base{Task: bugFix, Run: events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}}, res, pol, now)
		if c != task.CauseApplied {
			t.Fatalf("record: %s", c)
		}
		return st
	}
	retrying := record(fail)
	if retrying.Decision != events.DecisionRetry || retrying.Pass != 2 {
		t.Fatalf("setup: %+v", retrying)
	}
	next := events.Base{Task: bugFix, Run: events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine}, At: now}
	handedOff, _ := task.HandOff(retrying, true, next, "rung rate")
	blocked, _ := task.Block(retrying, true, next, "trust", events.CauseTrust)
	running, _ := task.SetStatus(retrying, true, next, events.StatusRunning, "")
	succeeded := record(events.Result{Outcome: events.OutcomeSuccess})
	resolved := task.Act(record(events.Result{Outcome: events.OutcomeFailure, Error: "x", ErrorClass: events.ErrorClassDeterministic}),
		events.Action{Action: events.ActionResolve, By: "ann", At: now})
	requeued := task.Act(resolved, events.Action{Action: events.ActionRequeue, By: "ann", At: now})
	// the other ends a recorded attempt can lead to, as Apply leaves them
	with := func(st events.TaskState, status events.Status, d events.Decision, pass int) events.TaskState {
		st.Status, st.Decision, st.Pass = status, d, pass
		return st
	}
	parked := with(retrying, events.StatusParked, events.DecisionPark, 2)
	stuck := with(retrying, events.StatusBlocked, events.DecisionStuck, 1)
	failed := with(retrying, events.StatusFailed, events.DecisionFail, 1)
	budget := with(retrying, events.StatusBlocked, events.DecisionHandoff, 1)
	fromScratch := with(succeeded, events.StatusSucceeded, events.DecisionSucceeded, 0) // state recreated by Record

	cases := []struct {
		name string
		st   events.TaskState
		pass int
		want bool
	}{
		{"a retry not yet taken up", retrying, 1, true},
		{"a retry the gate handed off at the next pass", handedOff, 1, false},
		{"a retry the gate blocked at the next pass", blocked, 1, false},
		{"a retry the next pass started", running, 1, false},
		{"a success", succeeded, 1, true},
		{"an earlier pass", retrying, 0, false},
		{"no record at all", task.New(bugFix), 1, false},
		{"a failure a human resolved", resolved, 1, false},
		{"a failure a human requeued", requeued, 1, false},
		{"a park not yet due", parked, 1, true},
		{"a pipeline out of skips", stuck, 1, true},
		{"a pipeline's final fail", failed, 1, true},
		{"a task over its budget", budget, 1, true},
		{"a success on a state Record recreated", fromScratch, 1, true},
		{"a park whose pass began", with(parked, events.StatusVerifying, events.DecisionPark, 2), 1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := task.AsRecorded(c.st, c.pass); got != c.want {
				t.Fatalf("AsRecorded = %v, want %v (status %s, decision %s, pass %d)", got, c.want, c.st.Status, c.st.Decision, c.st.Pass)
			}
		})
	}
}
