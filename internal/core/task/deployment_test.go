package task_test

import (
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

// A failure of the deployment (key, quota, configuration, a tool that does
// not answer) hands off after one attempt with a reason that leads with what
// to fix, on the ladder and in a pipeline; other short-circuits keep the
// usual reason.
func TestDeploymentFaultHandsOffWithTheFixFirst(t *testing.T) {
	const fix = `deployment: model "gpt-5x" not found at https://api.example/v1 — set the type's model in the policy or DISPATCH_MODEL`
	pipeline := policy.Type{Steps: []policy.Step{{Name: "implement"}, {Name: "validate", Run: "command"}}}
	for _, class := range []events.ErrorClass{events.ErrorClassAuth, events.ErrorClassQuota, events.ErrorClassConfig, events.ErrorClassToolUnavailable} {
		for name, pol := range map[string]policy.Type{"ladder": {MaxRetries: 5}, "pipeline": pipeline} {
			t.Run(string(class)+" "+name, func(t *testing.T) {
				st := events.TaskState{ID: "t", Status: events.StatusRunning, Pass: 1}
				run := events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Step: "implement"}
				task.Apply(&st, events.Task{ID: "t"}, run, failed(class, fix+"; the provider said: 404 Not Found"), pol, now)
				if st.Status != events.StatusBlocked || st.Decision != events.DecisionHandoff {
					t.Fatalf("status %s decision %s, want a handoff after one attempt (%s)", st.Status, st.Decision, st.Reason)
				}
				if !strings.HasPrefix(st.Reason, fix) || !strings.Contains(st.Reason, "HANDOFF") {
					t.Errorf("reason %q, want it to lead with the fix and say HANDOFF", st.Reason)
				}
			})
		}
	}
	st := events.TaskState{ID: "t", Status: events.StatusRunning, Pass: 1}
	task.Apply(&st, events.Task{ID: "t"}, events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine},
		failed(events.ErrorClassTimeout, "command timed out"), policy.Type{}, now)
	if st.Decision != events.DecisionHandoff || !strings.HasPrefix(st.Reason, "HANDOFF after 1 attempts") {
		t.Errorf("a timeout: %s %q, want the usual handoff reason", st.Decision, st.Reason)
	}
}

// Only what the model did counts for its type's trust and enters its
// subject's history: a provider that stayed unavailable, a refused request
// and the deployment's faults say nothing about either — in the history
// they would start the subject's next task on PIVOT (three "failures") and
// crowd its real failures out of the prompt.
func TestCountsForTrustAndHistory(t *testing.T) {
	tests := []struct {
		res  events.Result
		want bool
	}{
		{ok(), true},
		{failed(events.ErrorClassTask, "x"), true},
		{failed(events.ErrorClassInvalidOutput, "x"), true},
		{failed(events.ErrorClassDeterministic, "x"), true},
		{failed(events.ErrorClassDeadEnd, "repeats"), true},
		{failed(events.ErrorClassStep, "vet"), true},
		{failed(events.ErrorClassTimeout, "x"), true},
		{failed(events.ErrorClassBudget, "x"), true},
		{failed(events.ErrorClassTransient, "provider unavailable"), false},
		{failed(events.ErrorClassRefused, "refused"), false},
		{failed(events.ErrorClassAuth, "401"), false},
		{failed(events.ErrorClassQuota, "quota"), false},
		{failed(events.ErrorClassConfig, "404 model"), false},
		{failed(events.ErrorClassToolUnavailable, "no responders"), false},
	}
	for _, tt := range tests {
		if got := task.CountsForTrust(tt.res); got != tt.want {
			t.Errorf("CountsForTrust(%s) = %v, want %v", tt.res.ErrorClass, got, tt.want)
		}
		if got := task.CountsForHistory(tt.res); got != tt.want {
			t.Errorf("CountsForHistory(%s) = %v, want %v", tt.res.ErrorClass, got, tt.want)
		}
	}
}
