package executor_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

var refusedKey = status(http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`)

// A chain entry on another endpoint that names no credential is called
// without a key: the executor's own key never goes to a host the policy
// names (the keyless local model of the docs).
func TestChainEntryWithoutCredentialGetsNoKey(t *testing.T) {
	local := openaitest.New(t, always(ok("local")))
	e := newEnv(t, always(ok("own")), policy.Type{Models: []policy.Model{{Name: "local", Model: "llama3", BaseURL: local.BaseURL()}}},
		func(c *executor.Config) { c.APIKey = "sk-test" })
	if r := e.handle("t1", 1, testMessages).result(t); r.Route != "local" || r.Outcome != events.OutcomeSuccess {
		t.Fatalf("result %+v, want the local model's success", r)
	}
	for _, req := range local.Requests() {
		if got := req.Header.Get("Authorization"); got != "" {
			t.Errorf("the local model got Authorization %q, want none", got)
		}
	}
	if local.Calls() != 1 || e.model.Calls() != 0 {
		t.Errorf("calls local %d, own %d; want 1 and 0", local.Calls(), e.model.Calls())
	}
}

// A request's identity is its model's endpoint and key, not how the policy
// spells them: a renamed credential holding the same key, or the base_url
// with a trailing slash, does not send again a request that failed
// deterministically; a rotated key does.
func TestChainRequestIdentityIsEndpointAndKey(t *testing.T) {
	src := policy.Static(nil)
	keys := map[string]string{"a": "sk-1", "renamed": "sk-1"}
	e := newEnv(t, always(status(http.StatusBadRequest, `{"error":{"message":"missing required field","type":"invalid_request_error","param":"email","code":"missing_field"}}`)),
		policy.Type{}, func(c *executor.Config) {
			c.Policy = src
			c.Credential = func(name string) (string, bool) { k, ok := keys[name]; return k, ok }
		})
	set := func(base, cred string) {
		src.Store(&policy.Snapshot{File: &policy.File{Types: map[string]policy.Type{"css_fix": {Models: []policy.Model{
			{Name: "m", Model: "gpt-4o", BaseURL: base, Credential: cred},
		}}}}}, 0)
	}
	set(e.model.BaseURL()+"/", "a")
	if r := e.handle("t1", 1, testMessages).result(t); r.Outcome != events.OutcomeFailure || e.model.Calls() != 1 {
		t.Fatalf("result %+v after %d calls, want the 400's failure after one", r, e.model.Calls())
	}
	set(e.model.BaseURL(), "renamed")
	e.handle("t1", 2, testMessages)
	if n := e.model.Calls(); n != 1 {
		t.Errorf("%d calls after the credential's rename, want 1: the identical request is not sent again", n)
	}
	keys["a"] = "sk-2"
	set(e.model.BaseURL(), "a")
	e.handle("t1", 3, testMessages)
	if n := e.model.Calls(); n != 2 {
		t.Errorf("%d calls after the key's rotation, want 2: another key is another request", n)
	}
}

// A type without a chain never calls a key again once it was refused: not
// from another task, nor after a policy edit.
func TestRefusedKeyIsNotCalledAgainWithoutAChain(t *testing.T) {
	src := policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": {Model: "gpt-4o"}}})
	e := newEnv(t, always(refusedKey), policy.Type{}, func(c *executor.Config) { c.Policy = src })
	if r := e.handle("t1", 1, testMessages).result(t); r.ErrorClass != events.ErrorClassAuth || e.model.Calls() != 1 {
		t.Fatalf("result %+v after %d calls, want an auth failure after one", r, e.model.Calls())
	}
	src.Store(&policy.Snapshot{File: &policy.File{Types: map[string]policy.Type{"css_fix": {Model: "gpt-4o", MaxRetries: 5}}}, Rev: 7}, 7)
	r := e.handle("t2", 1, testMessages).result(t)
	if r.ErrorClass != events.ErrorClassAuth || !strings.Contains(r.Error, "not called again with this key") || !strings.Contains(r.Error, "DISPATCH_OPENAI_API_KEY") {
		t.Errorf("second task: %+v, want the auth fix from the key's mark", r)
	}
	if n := e.model.Calls(); n != 1 {
		t.Errorf("%d calls, want 1: a refused key is not called again", n)
	}
	if st := e.state("t2"); len(st.FailedRequests) != 0 {
		t.Errorf("t2 bans %v, want nothing: it sent no request", st.FailedRequests)
	}
}

// When no model is left, the attempt bans only the requests it sent: a
// model passed over without a call (its credential not set) is not
// banned, so setting the credential lets the request go.
func TestNoModelLeftBansOnlyWhatWasSent(t *testing.T) {
	c := newChainEnv(t, always(refusedKey), always(ok("spare")), 1, map[string]string{"a": "sk-a"})
	e := c.instances[0]
	r := e.handle("t1", 1, testMessages).result(t)
	if r.ErrorClass != events.ErrorClassAuth {
		t.Fatalf("result %+v, want an auth failure", r)
	}
	st := e.state("t1")
	if len(st.FailedRequests) != 1 || len(r.Banned) != 1 || r.RequestHash == "" || !strings.HasPrefix(st.FailedRequests[0], r.RequestHash) || r.Banned[0] != r.RequestHash+"/auth" {
		t.Errorf("banned %v (result %v, hash %s), want only the primary's request", st.FailedRequests, r.Banned, r.RequestHash)
	}
}

// cancelling is a model that, once it has answered, cancels the call's
// context at the next reading of the clock: a shutdown right after the
// answer came.
type cancelling struct {
	*executor.OpenAI
	armed  atomic.Bool
	cancel context.CancelFunc
}

func (m *cancelling) Complete(ctx context.Context, r executor.Request) (executor.Response, error) {
	resp, err := m.OpenAI.Complete(ctx, r)
	m.armed.Store(true)
	return resp, err
}

// A shutdown right after a 401 keeps the key's mark and the request's ban:
// the redelivery does not send to the refused key again, nor does any
// other instance.
func TestRefusedKeyIsMarkedThroughAShutdown(t *testing.T) {
	ns := natstest.Start(t)
	modelsKV, err := ns.JS.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: services.BucketModels})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var m *cancelling
	e := newEnv(t, always(refusedKey), policy.Type{}, func(c *executor.Config) {
		m = &cancelling{OpenAI: c.Model.(*executor.OpenAI), cancel: cancel}
		c.Model, c.ModelStates = m, modelsKV
		now := c.Now
		c.Now = func() time.Time {
			if m.armed.Load() {
				m.cancel()
			}
			return now()
		}
	})
	if h := e.handleCtx(ctx, "t1", events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Step: "execute"}, testMessages); h.err == nil {
		t.Fatalf("shutdown delivery: %d outputs, want an error (redelivered)", len(h.outs))
	}
	if st := e.state("t1"); len(st.FailedRequests) != 1 {
		t.Errorf("t1 bans %v, want the refused request", st.FailedRequests)
	}
	keys, err := modelsKV.Keys(context.Background())
	if err != nil || !slicesContainsPrefix(keys, "dead.") {
		t.Errorf("bucket keys %v (%v), want the key's mark", keys, err)
	}
	m.armed.Store(false)
	if r := e.redeliver("t1", 1, testMessages).result(t); r.Outcome != events.OutcomeFailure {
		t.Errorf("redelivery: %+v, want a failure", r)
	}
	if n := e.model.Calls(); n != 1 {
		t.Errorf("%d calls, want 1: the refused key is not called again", n)
	}
}

func slicesContainsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// A chain model's transient failures are counted under its name, not its
// policy URL (a metric label must come from a bounded set).
func TestChainTransientMetricIsLabelledByName(t *testing.T) {
	down := status(http.StatusServiceUnavailable, unavailable)
	c := newChainEnv(t, always(down), always(down), 1, bothKeys)
	e := c.instances[0]
	e.handle("t1", 1, testMessages).snooze(t)
	if n := e.counter("dispatch_executor_transient_retries_total", map[string]string{"endpoint": "spare"}); n != 1 {
		t.Errorf("%v transient failures counted for spare, want 1", n)
	}
	if n := e.counter("dispatch_executor_transient_retries_total", map[string]string{"endpoint": c.spare.BaseURL()}); n != 0 {
		t.Errorf("%v transient failures counted under the spare's URL, want 0", n)
	}
}

// A keyless entry whose endpoint wants a key says so in the fix.
func TestChainKeylessEntryRefusedNamesTheCredential(t *testing.T) {
	local := openaitest.New(t, always(refusedKey))
	e := newEnv(t, always(ok("own")), policy.Type{Models: []policy.Model{{Name: "local", Model: "llama3", BaseURL: local.BaseURL()}}},
		func(c *executor.Config) { c.APIKey = "sk-test" })
	r := e.handle("t1", 1, testMessages).result(t)
	if r.ErrorClass != events.ErrorClassAuth || !strings.Contains(r.Error, "check the credential of the entry (it names none: it is called without a key) (models[0] of the type's policy)") {
		t.Errorf("result %+v, want the auth fix naming the missing credential", r)
	}
}
