package task_test

import (
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

// An Executed bans what its calls banned on models of the chain they passed
// over, besides its own request, once however often it is folded.
func TestExecutedBansTheChainsFailedRequests(t *testing.T) {
	b := events.Base{Task: events.Task{ID: "t1", Type: "css_fix"}, Run: events.Run{Pass: 2}}
	res := events.Result{Outcome: events.OutcomeSuccess, RequestHash: "ok", Banned: []string{"a/auth", "b/config"}}
	st, cause := task.Executed(events.TaskState{}, false, b, res)
	if cause != task.CauseApplied || len(st.FailedRequests) != 2 || st.FailedRequests[0] != "a@2/auth" || st.FailedRequests[1] != "b@2/config" {
		t.Fatalf("state %v (%v), want a and b banned in pass 2 with their classes", st.FailedRequests, cause)
	}
	again, cause := task.Executed(st, true, b, res)
	if cause != task.CauseRedelivered || len(again.FailedRequests) != 2 {
		t.Errorf("folded again: %v (%v), want no change", again.FailedRequests, cause)
	}
	failed := events.Result{Outcome: events.OutcomeFailure, ErrorClass: events.ErrorClassDeterministic, RequestHash: "c", Banned: []string{"a/auth"}}
	if st, _ := task.Executed(st, true, b, failed); len(st.FailedRequests) != 3 || st.FailedRequests[2] != "c@2" {
		t.Errorf("state %v, want c banned too", st.FailedRequests)
	}
}
