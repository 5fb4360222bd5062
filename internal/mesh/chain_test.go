package mesh_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// A type chains two models on two endpoints, each with its own named
// credential. While the first answers 503 (a switch, not a clock), tasks
// finish on the second in their first attempt with no transient retry;
// once it is back, the traffic returns to it after the (short) cool-down.
// Through the whole mesh: the bucket dispatch_models provisioned, the
// policy's chain, the executor's credentials.
func TestModelChainThroughTheMesh(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	primary := openaitest.New(t, func(int, openaitest.Request) openaitest.Reply {
		if down.Load() {
			return openaitest.Reply{Status: http.StatusServiceUnavailable, Body: `{"error":{"message":"overloaded","type":"server_error"}}`}
		}
		return openaitest.Reply{Content: openaitest.Success("primary")}
	})
	spare := openaitest.New(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("spare")}
	})
	e := newEnv(t, succeed, &policy.File{Types: map[string]policy.Type{"bug_fix": {Models: []policy.Model{
		{Name: "primary", Model: "gpt-4o", BaseURL: primary.BaseURL(), Credential: "primary"},
		{Name: "spare", Model: "llama3", BaseURL: spare.BaseURL(), Credential: "spare"},
	}}}})
	nc, _ := e.srv.Connect(t)
	e.startWith(nc, mesh.Options{
		Model:   executor.NewOpenAI(executor.OpenAIConfig{BaseURL: e.model.BaseURL(), APIKey: "test"}),
		AckWait: 2 * time.Second,
		Circuit: executor.CircuitConfig{Threshold: 2, CoolDown: 200 * time.Millisecond, MaxCoolDown: 200 * time.Millisecond},
		Credential: func(name string) (string, bool) {
			return map[string]string{"primary": "sk-primary", "spare": "sk-spare"}[name], true
		},
	})

	const n = 6
	for i := range n {
		e.submit(events.Submit{ID: fmt.Sprintf("down%d", i), Type: "bug_fix", Subject: fmt.Sprintf("f%d.go", i)})
	}
	for i := range n {
		id := fmt.Sprintf("down%d", i)
		if got := last(e.waitEnd(id)).Stage; got != events.StageSucceeded {
			t.Fatalf("%s ended with %s, want succeeded", id, got)
		}
		st := e.state(id)
		if st.Attempts != 1 || st.TransientRetries != 0 || len(st.History) != 1 || st.History[0].Model != "spare" {
			t.Errorf("%s: %d attempts, %d transient retries, history %+v; want one attempt answered by spare", id, st.Attempts, st.TransientRetries, st.History)
		}
	}
	// How often the primary was called depends on how the tasks fall
	// around its 200 ms cool-downs (a probe each time one ends): the
	// executor's tests pin the breaker with a test clock; here it is told.
	t.Logf("the primary was called %d times for %d tasks", primary.Calls(), n)
	if e.model.Calls() != 0 {
		t.Errorf("the executor's own endpoint was called %d times: the chain names both", e.model.Calls())
	}

	// Back up: the first task after the cool-down probes it, and the
	// traffic stays there. (A deadlock guard bounds the tasks, not a clock.)
	down.Store(false)
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatal("no task went back to the primary after it recovered")
		}
		id := fmt.Sprintf("up%d", i)
		e.submit(events.Submit{ID: id, Type: "bug_fix", Subject: "g.go"})
		if got := last(e.waitEnd(id)).Stage; got != events.StageSucceeded {
			t.Fatalf("%s ended with %s, want succeeded", id, got)
		}
		if e.state(id).History[0].Model == "primary" {
			break
		}
		time.Sleep(20 * time.Millisecond) // let the cool-down pass: no assertion on it
	}
	for i := range 3 {
		id := fmt.Sprintf("after%d", i)
		e.submit(events.Submit{ID: id, Type: "bug_fix", Subject: "h.go"})
		e.waitEnd(id)
		if m := e.state(id).History[0].Model; m != "primary" {
			t.Errorf("%s answered by %s after the primary recovered, want primary", id, m)
		}
	}
}
