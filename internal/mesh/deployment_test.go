package mesh_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Errors about the deployment are not the task's fault: a model that does
// not exist, a refused key, an exhausted quota and a prompt longer than the
// context each cost one call, reach a human with a reason that leads with
// what to fix, and never touch the type's trust. A refused key and a spent
// quota stop every later call with that key, whatever the task: each of
// them runs on its own mesh (its own endpoint and key).
func TestDeploymentFaultsReachAHumanWithTheFix(t *testing.T) {
	replies := map[string]openaitest.Reply{
		"model.go": {Status: http.StatusNotFound,
			Body: `{"error":{"message":"The model ` + "`gpt-5x`" + ` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`},
		"key.go": {Status: http.StatusUnauthorized,
			Body: `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`},
		"quota.go": {Status: http.StatusTooManyRequests,
			Body: `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`},
		"context.go": {Status: http.StatusBadRequest,
			Body: `{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9120 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`},
	}
	for _, subjects := range [][]string{{"model.go", "context.go"}, {"key.go"}, {"quota.go"}} {
		deploymentFaults(t, replies, subjects)
	}
}

// deploymentFaults runs the tasks of subjects on one mesh whose model
// answers each with its reply.
func deploymentFaults(t *testing.T, replies map[string]openaitest.Reply, subjects []string) {
	t.Helper()
	var mu sync.Mutex
	calls := map[string]int{}
	e := newEnv(t, func(_ int, r openaitest.Request) openaitest.Reply {
		for _, subject := range subjects {
			if strings.Contains(r.Messages[1].Content, subject) {
				mu.Lock()
				calls[subject]++
				mu.Unlock()
				return replies[subject]
			}
		}
		return openaitest.Reply{Content: openaitest.Success("unexpected")}
	}, &policy.File{Types: map[string]policy.Type{"bug_fix": {Model: "gpt-5x"}}})
	e.start()
	fixes := map[string]string{
		"model.go":   `deployment: model "gpt-5x" not found at ` + e.model.BaseURL() + ` — set the type's model in the policy or DISPATCH_MODEL`,
		"key.go":     `deployment: the API key was refused (401) at ` + e.model.BaseURL() + ` — check DISPATCH_OPENAI_API_KEY`,
		"quota.go":   `deployment: quota exhausted at ` + e.model.BaseURL() + ` — raise the quota or the billing limit`,
		"context.go": `deployment: the prompt (9120 tokens) exceeds the context (8192 tokens) of model "gpt-5x" — choose a model with a larger context`,
	}
	for _, subject := range subjects {
		e.submit(events.Submit{ID: strings.TrimSuffix(subject, ".go"), Type: "bug_fix", Subject: subject})
	}
	for _, subject := range subjects {
		fix := fixes[subject]
		id := strings.TrimSuffix(subject, ".go")
		if got := last(e.waitEnd(id)).Stage; got != "review.escalated" {
			t.Errorf("%s ended with %s, want review.escalated", id, got)
		}
		st := e.state(id)
		mu.Lock()
		n := calls[subject]
		mu.Unlock()
		if st.Status != events.StatusBlocked || st.Attempts != 1 || n != 1 {
			t.Errorf("%s: %s after %d attempts and %d calls, want blocked after 1 and 1", id, st.Status, st.Attempts, n)
		}
		if !strings.HasPrefix(st.Reason, fix) || !strings.Contains(st.Reason, "HANDOFF") {
			t.Errorf("%s: reason\n%s\nwant it to lead with\n%s", id, st.Reason, fix)
		}
	}
	for _, m := range e.reviews("escalated") {
		var esc events.Escalated
		if err := jsonUnmarshal(m.Data, &esc); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(esc.Reason, fixes[esc.Task.Subject]) {
			t.Errorf("escalation record of %s: reason %q, want the fix first", esc.Task.ID, esc.Reason)
		}
	}
	view, err := trust.NewView(context.Background(), e.srv.JS, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Stop()
	if stats := view.Stats("bug_fix"); len(stats.Outcomes) != 0 {
		t.Errorf("trust of bug_fix %+v, want no outcome recorded", stats)
	}
}

// An agent command that cannot start is the deployment's fault, end to
// end: one attempt, then a human, with the fix first — never seven rungs
// of a command that will never run, never an outcome of its type's trust
// nor an entry of its subject's history.
func TestAnAgentThatCannotStartReachesAHuman(t *testing.T) {
	e := newEnv(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("never asked")}
	}, &policy.File{Types: map[string]policy.Type{
		"agent_fix": {Executor: executor.ExecutorCommand, Command: []string{"no-such-agent-cli", "--json"}},
	}})
	e.start()
	e.submit(events.Submit{ID: "agent", Type: "agent_fix", Subject: "a.go"})
	if got := last(e.waitEnd("agent")).Stage; got != "review.escalated" {
		t.Fatalf("ended with %s, want review.escalated", got)
	}
	st := e.state("agent")
	const fix = `deployment: the command "no-such-agent-cli --json" cannot run`
	if st.Status != events.StatusBlocked || st.Attempts != 1 || !strings.HasPrefix(st.Reason, fix) {
		t.Errorf("%s after %d attempts, reason %q; want blocked after 1, the fix first", st.Status, st.Attempts, st.Reason)
	}
	view, err := trust.NewView(context.Background(), e.srv.JS, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Stop()
	if stats := view.Stats("agent_fix"); len(stats.Outcomes) != 0 {
		t.Errorf("trust of agent_fix %+v, want no outcome recorded", stats)
	}
	kv, err := e.srv.JS.KeyValue(context.Background(), services.BucketHistory)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := history.NewStore(kv).Recent(context.Background(), "agent_fix", "a.go"); err != nil || len(rec.Outcomes) != 0 {
		t.Errorf("history of a.go %+v (%v), want nothing", rec, err)
	}
}
