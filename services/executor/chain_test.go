package executor_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// chainEnv is a type whose policy chains two models on two scripted
// endpoints, each called with its own named credential, and executor
// instances sharing one task bucket and one model-state bucket.
type chainEnv struct {
	t              *testing.T
	primary, spare *openaitest.Server
	instances      []*env
	clock          *clock
	reg            *prometheus.Registry
}

// chainCircuit opens a model's circuit after 2 transient failures, for
// 30s of the test clock.
var chainCircuit = executor.CircuitConfig{Threshold: 2, CoolDown: 30 * time.Second, MaxCoolDown: time.Minute}

func newChainEnv(t *testing.T, primary, spare openaitest.Script, instances int, creds map[string]string) *chainEnv {
	t.Helper()
	ns := natstest.Start(t)
	ctx := context.Background()
	tasksKV, err := ns.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: services.BucketTasks})
	if err != nil {
		t.Fatal(err)
	}
	modelsKV, err := ns.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: services.BucketModels})
	if err != nil {
		t.Fatal(err)
	}
	c := &chainEnv{t: t, primary: openaitest.New(t, primary), spare: openaitest.New(t, spare), clock: &clock{now: testNow}, reg: prometheus.NewRegistry()}
	pol := policy.Type{Models: []policy.Model{
		{Name: "primary", Model: "gpt-4o", BaseURL: c.primary.BaseURL(), Credential: "a"},
		{Name: "spare", Model: "llama3", BaseURL: c.spare.BaseURL(), Credential: "b"},
	}}
	tasks := services.NewTaskStore(tasksKV)
	for i := range instances {
		cfg := executor.Config{
			Model:       executor.Simulated{}, // the chain names every endpoint: never asked
			Policy:      policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": pol}}),
			Prices:      map[string]executor.Price{"gpt-4o": {InputPerMTok: 2.5, OutputPerMTok: 10}, "llama3": {InputPerMTok: 1, OutputPerMTok: 1}},
			Tasks:       tasks,
			ModelStates: modelsKV,
			Circuit:     chainCircuit,
			Credential: func(name string) (string, bool) {
				k, ok := creds[name]
				return k, ok
			},
			Instance: fmt.Sprintf("executor@%d", i),
			Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
			Now:      c.clock.Now,
			Rand:     func() float64 { return 0.5 },
			Registry: c.reg,
		}
		s, err := executor.New(cfg)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		t.Cleanup(s.Close)
		c.instances = append(c.instances, &env{Service: s, t: t, tasks: tasks, clock: c.clock, reg: c.reg})
	}
	return c
}

var bothKeys = map[string]string{"a": "sk-a", "b": "sk-b"}

// switched answers 503 while down is set, else a success.
func switched(down *atomic.Bool) openaitest.Script {
	return func(int, openaitest.Request) openaitest.Reply {
		if down.Load() {
			return status(http.StatusServiceUnavailable, unavailable)
		}
		return ok("fixed it")
	}
}

// The first model answers 503 until it is switched back: every task
// finishes on the second model in its first attempt, none waits (no
// snooze, no transient retry); after 2 failures the first model cools
// down and is not called; once it recovers, the first call after the
// cool-down probes it and the traffic returns to it.
func TestChainFallsBackWhileTheFirstModelIsDown(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	c := newChainEnv(t, switched(&down), always(ok("fixed it on the spare")), 1, bothKeys)
	e := c.instances[0]

	for i := range 10 {
		id := fmt.Sprintf("t%d", i)
		r := e.handle(id, 1, testMessages).result(t)
		if r.Outcome != events.OutcomeSuccess || r.Route != "spare" || r.Model != "llama3" || r.TransientRetries != 0 || !slices.Equal(r.Fallbacks, []string{"primary"}) {
			t.Fatalf("%s: result %+v, want a success of the spare that passed the primary over, no transient retry", id, r)
		}
		if st := e.state(id); st.TransientRetries != 0 || st.Pass != 1 {
			t.Errorf("%s: state %+v, want pass 1 and no transient retry", id, st)
		}
		if r.Cost == 0 || r.TokensIn != 100 {
			t.Errorf("%s: spend %d tokens, $%g; want the spare's answer billed", id, r.TokensIn, r.Cost)
		}
	}
	if n := c.primary.Calls(); n != chainCircuit.Threshold {
		t.Errorf("primary called %d times, want %d: then it cools down", n, chainCircuit.Threshold)
	}
	if n := c.spare.Calls(); n != 10 {
		t.Errorf("spare called %d times, want 10", n)
	}
	for _, k := range c.spare.Requests() {
		if k.Model != "llama3" || k.Header.Get("Authorization") != "Bearer sk-b" {
			t.Errorf("spare asked for %q with %q, want llama3 with its own key", k.Model, k.Header.Get("Authorization"))
		}
	}
	for _, k := range c.primary.Requests() {
		if k.Model != "gpt-4o" || k.Header.Get("Authorization") != "Bearer sk-a" {
			t.Errorf("primary asked for %q with %q, want gpt-4o with its own key", k.Model, k.Header.Get("Authorization"))
		}
	}
	if n := e.counter("dispatch_model_cooldowns_total", map[string]string{"model": "primary"}); n != 1 {
		t.Errorf("%v cool-downs of primary counted, want 1", n)
	}
	if n := e.counter("dispatch_model_skips_total", map[string]string{"model": "primary", "reason": "cooling"}); n != 8 {
		t.Errorf("%v calls passed primary over while it cooled down, want 8", n)
	}
	if n := e.counter("dispatch_model_calls_total", map[string]string{"model": "spare"}); n != 10 {
		t.Errorf("%v calls of spare counted, want 10", n)
	}
	if n := e.counter("dispatch_model_tokens_total", map[string]string{"model": "spare", "direction": "in"}); n != 1000 {
		t.Errorf("%v input tokens of spare counted, want 1000", n)
	}
	if n := e.counter("dispatch_model_errors_total", map[string]string{"model": "primary", "class": "transient"}); n != 2 {
		t.Errorf("%v transient errors of primary counted, want 2", n)
	}

	// The primary recovers; its cool-down holds until it ends.
	down.Store(false)
	c.clock.Advance(29 * time.Second)
	if r := e.handle("t10", 1, testMessages).result(t); r.Route != "spare" {
		t.Errorf("during the cool-down: answered by %q, want spare", r.Route)
	}
	c.clock.Advance(time.Second)
	for i := 11; i < 15; i++ {
		r := e.handle(fmt.Sprintf("t%d", i), 1, testMessages).result(t)
		if r.Outcome != events.OutcomeSuccess || r.Route != "primary" || len(r.Fallbacks) != 0 {
			t.Errorf("t%d after the cool-down: %+v, want the primary's success", i, r)
		}
	}
	if n := c.primary.Calls(); n != chainCircuit.Threshold+4 {
		t.Errorf("primary called %d times, want %d + the probe and 3 more", n, chainCircuit.Threshold)
	}
	if st := e.state("t11"); len(st.History) != 0 && st.History[len(st.History)-1].Model != "primary" {
		t.Errorf("attempt record names %q, want primary", st.History[len(st.History)-1].Model)
	}
}

// When every model of the chain fails transiently, the task waits and
// the failure counts once against its transient budget: the call went to
// each model once.
func TestChainAllDownWaitsOnce(t *testing.T) {
	down := always(status(http.StatusServiceUnavailable, unavailable))
	c := newChainEnv(t, down, down, 1, bothKeys)
	e := c.instances[0]
	e.handle("t1", 1, testMessages).snooze(t)
	if st := e.state("t1"); st.TransientRetries != 1 {
		t.Errorf("transient retries %d, want 1", st.TransientRetries)
	}
	if c.primary.Calls() != 1 || c.spare.Calls() != 1 {
		t.Errorf("calls %d and %d, want one to each model", c.primary.Calls(), c.spare.Calls())
	}
	// Both open after the threshold: the next task waits for the
	// cool-down without a call, not a transient retry.
	e.handle("t2", 1, testMessages).snooze(t)
	d := e.handle("t3", 1, testMessages)
	if d.snooze(t) != 30*time.Second {
		t.Errorf("snooze %v, want the 30s cool-down", d.snooze(t))
	}
	if st := e.state("t3"); st.TransientRetries != 0 {
		t.Errorf("t3: transient retries %d while every model cools down, want 0", st.TransientRetries)
	}
	if c.primary.Calls() != 2 || c.spare.Calls() != 2 {
		t.Errorf("calls %d and %d, want 2 each (the threshold), none while cooling", c.primary.Calls(), c.spare.Calls())
	}
}

// Two executor instances share the cool-down through the bucket: once
// one opened the primary's circuit, the other passes it over without a
// call.
func TestChainCoolDownIsSharedByInstances(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	c := newChainEnv(t, switched(&down), always(ok("spare")), 2, bothKeys)
	x, y := c.instances[0], c.instances[1]
	for i := range chainCircuit.Threshold {
		if r := x.handle(fmt.Sprintf("x%d", i), 1, testMessages).result(t); r.Route != "spare" {
			t.Fatalf("x%d answered by %q, want spare", i, r.Route)
		}
	}
	// y hears the circuit through its watcher of the bucket.
	deadline := time.Now().Add(10 * time.Second)
	for y.CircuitSeen(c.primary.BaseURL(), "gpt-4o") != executor.CircuitOpen {
		if time.Now().After(deadline) {
			t.Fatal("the second instance never saw the primary's circuit open")
		}
		time.Sleep(5 * time.Millisecond)
	}
	calls := c.primary.Calls()
	for i := range 5 {
		r := y.handle(fmt.Sprintf("y%d", i), 1, testMessages).result(t)
		if r.Route != "spare" || !slices.Equal(r.Fallbacks, []string{"primary"}) {
			t.Errorf("y%d: %+v, want the spare, the primary passed over", i, r)
		}
	}
	if n := c.primary.Calls(); n != calls {
		t.Errorf("the second instance called the cooling primary %d times, want 0", n-calls)
	}
	// After the cool-down one probe goes: the instances share one probe.
	down.Store(false)
	c.clock.Advance(30 * time.Second)
	if r := y.handle("y5", 1, testMessages).result(t); r.Route != "primary" {
		t.Errorf("after the cool-down y's task went to %q, want primary", r.Route)
	}
	deadline = time.Now().Add(10 * time.Second)
	for x.CircuitSeen(c.primary.BaseURL(), "gpt-4o") != executor.CircuitClosed {
		if time.Now().After(deadline) {
			t.Fatal("the first instance never saw the primary's circuit close")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r := x.handle("x9", 1, testMessages).result(t); r.Route != "primary" {
		t.Errorf("x's task went to %q, want primary", r.Route)
	}
}

// A deployment fault of the first model (its key refused, the model not
// found) moves the call to the next model at once; the faulty one is not
// called again by any task, and its request is banned for the task.
func TestChainMovesOnFromDeploymentFaults(t *testing.T) {
	tests := []struct {
		name  string
		reply openaitest.Reply
		class events.ErrorClass
	}{
		{"401", status(http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`), events.ErrorClassAuth},
		{"404 model", status(http.StatusNotFound, `{"error":{"message":"The model gpt-4o does not exist","type":"invalid_request_error","code":"model_not_found"}}`), events.ErrorClassConfig},
		{"quota", status(http.StatusTooManyRequests, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`), events.ErrorClassQuota},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newChainEnv(t, always(tt.reply), always(ok("spare")), 1, bothKeys)
			e := c.instances[0]
			for i := range 4 {
				id := fmt.Sprintf("t%d", i)
				r := e.handle(id, 1, testMessages).result(t)
				if i == 0 && (len(r.Banned) != 1 || !strings.HasSuffix(r.Banned[0], "/"+string(tt.class))) {
					t.Errorf("t0 result bans %v, want the primary's request as %s", r.Banned, tt.class)
				}
				if r.Outcome != events.OutcomeSuccess || r.Route != "spare" || !slices.Equal(r.Fallbacks, []string{"primary"}) {
					t.Fatalf("%s: %+v, want the spare's success", id, r)
				}
			}
			if n := c.primary.Calls(); n != 1 {
				t.Errorf("primary called %d times, want once: its fault is marked for every task", n)
			}
			if st := e.state("t0"); len(st.FailedRequests) != 1 || !strings.HasSuffix(st.FailedRequests[0], "/"+string(tt.class)) {
				t.Errorf("t0 failed requests %v, want the primary's request banned as %s", st.FailedRequests, tt.class)
			}
			// the Executed says so too: a rebuild from the stream bans it again
			r := e.handle("t9", 1, testMessages).result(t)
			if len(r.Banned) != 0 {
				t.Errorf("a task passing the marked primary over bans %v, want nothing (no call)", r.Banned)
			}
			if n := e.counter("dispatch_model_skips_total", map[string]string{"model": "primary", "reason": "dead"}); n != 4 {
				t.Errorf("%v calls passed the dead primary over, want 4", n)
			}
		})
	}
}

// When no model of the chain is left, the attempt goes to a human with
// each model's fix; the next task calls nothing and says the same.
func TestChainNoneLeftGoesToAHumanWithTheFix(t *testing.T) {
	c := newChainEnv(t,
		always(status(http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`)),
		always(status(http.StatusNotFound, `{"error":{"message":"The model llama3 does not exist","type":"invalid_request_error","code":"model_not_found"}}`)),
		1, bothKeys)
	e := c.instances[0]
	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassAuth || !events.DeploymentFault(r.ErrorClass) {
		t.Fatalf("result %+v, want an auth failure (a deployment fault, for a human)", r)
	}
	for _, want := range []string{"none of the 2 models", "[primary]", "check DISPATCH_CREDENTIAL_A", "[spare]", `model "llama3" not found`} {
		if !strings.Contains(r.Error, want) {
			t.Errorf("error %q does not say %q", r.Error, want)
		}
	}
	r2 := e.handle("t2", 1, testMessages).result(t)
	if r2.ErrorClass != events.ErrorClassAuth || !strings.Contains(r2.Error, "found by a call at") || !strings.Contains(r2.Error, "DISPATCH_CREDENTIAL_A") {
		t.Errorf("second task: %+v, want the same fix from the marks", r2)
	}
	if c.primary.Calls() != 1 || c.spare.Calls() != 1 {
		t.Errorf("calls %d and %d, want one each: marked models are not called again", c.primary.Calls(), c.spare.Calls())
	}
}

// A credential that is not set is passed over; with none left, the fix
// names the variable to set.
func TestChainMissingCredential(t *testing.T) {
	c := newChainEnv(t, always(ok("primary")), always(ok("spare")), 1, map[string]string{"b": "sk-b"})
	e := c.instances[0]
	if r := e.handle("t1", 1, testMessages).result(t); r.Route != "spare" || c.primary.Calls() != 0 {
		t.Errorf("result %+v with %d primary calls, want the spare without calling the primary", r, c.primary.Calls())
	}
	c2 := newChainEnv(t, always(ok("primary")), always(ok("spare")), 1, nil)
	r := c2.instances[0].handle("t1", 1, testMessages).result(t)
	if r.ErrorClass != events.ErrorClassAuth || !strings.Contains(r.Error, "set DISPATCH_CREDENTIAL_A") || !strings.Contains(r.Error, "set DISPATCH_CREDENTIAL_B") {
		t.Errorf("result %+v, want an auth failure naming both variables", r)
	}
}

// A chain's request identity includes its model's endpoint and key: the
// same messages to two models hash apart.
func TestRequestHashIncludesTheEndpoint(t *testing.T) {
	req := executor.Request{Model: "gpt-4o", Messages: executor.PromptMessages(testMessages)}
	other := req
	other.Endpoint = "https://b.example/v1#b"
	if executor.RequestHash(req) == executor.RequestHash(other) {
		t.Error("two endpoints hash alike")
	}
}

// A chain may name models on the executor's own endpoint and key: a model
// the endpoint does not know passes the call to the next name.
func TestChainOnTheExecutorsOwnEndpoint(t *testing.T) {
	e := newEnv(t, func(_ int, r openaitest.Request) openaitest.Reply {
		if r.Model == "gpt-5x" {
			return status(http.StatusNotFound, `{"error":{"message":"The model gpt-5x does not exist","type":"invalid_request_error","code":"model_not_found"}}`)
		}
		return ok("fixed it")
	}, policy.Type{Model: "unused", Models: []policy.Model{{Model: "gpt-5x"}, {Model: "gpt-4o"}}}, nil)
	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.Route != "gpt-4o" || !slices.Equal(r.Fallbacks, []string{"gpt-5x"}) {
		t.Fatalf("result %+v, want gpt-4o's success after gpt-5x", r)
	}
	reqs := e.model.Requests()
	if len(reqs) != 2 || reqs[0].Model != "gpt-5x" || reqs[1].Model != "gpt-4o" || reqs[1].Header.Get("Authorization") != "Bearer sk-test" {
		t.Errorf("requests %d, want gpt-5x then gpt-4o with the executor's key", len(reqs))
	}
}

// A redelivered pass whose first delivery banned the first model's request
// (its deployment's fault) and died before its Executed was stored goes on
// to the next model, as the first delivery did: it does not fail again.
func TestChainRedeliveryPassesTheBannedModelOver(t *testing.T) {
	c := newChainEnv(t,
		always(status(http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`)),
		always(ok("spare")), 1, bothKeys)
	e := c.instances[0]
	if r := e.handle("t1", 1, testMessages).result(t); r.Route != "spare" {
		t.Fatalf("first delivery answered by %q, want spare", r.Route)
	}
	r := e.redeliver("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.Route != "spare" || len(r.Banned) != 1 {
		t.Errorf("redelivery: %+v, want the spare's success, the primary's request still banned", r)
	}
	if c.primary.Calls() != 1 {
		t.Errorf("primary called %d times, want once", c.primary.Calls())
	}
}
