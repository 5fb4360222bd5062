package executor_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

const badRequest = `{"error":{"message":"Invalid value for 'content': expected a string, got null.","type":"invalid_request_error","param":"messages.[1].content","code":"invalid_value"}}`

func TestDeterministicFailureBansTheRequest(t *testing.T) {
	e := newEnv(t, sequence(status(http.StatusBadRequest, badRequest), ok("changed")), policy.Type{}, nil)

	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassDeterministic || r.TokensIn != 0 {
		t.Errorf("result %+v, want a deterministic failure", r)
	}
	for _, said := range []string{"400 Bad Request", `"type":"invalid_request_error"`, `"code":"invalid_value"`,
		`"param":"messages.[1].content"`, "expected a string, got null"} {
		if !strings.Contains(r.Error, said) {
			t.Errorf("error %q lacks %s: the next prompt needs everything the provider said", r.Error, said)
		}
	}
	if st := e.state("t1"); !slices.Equal(st.FailedRequests, []string{task.FailedEntry(r.RequestHash, 1)}) {
		t.Fatalf("failed requests %v, want the request hash %s", st.FailedRequests, r.RequestHash)
	}

	// the next attempt sends the identical messages (whitespace aside): refused, not sent
	same := []events.Message{
		{Role: "system", Content: testMessages[0].Content + "  \r\n"},
		{Role: "user", Content: strings.ReplaceAll(testMessages[1].Content, "\n", " \r\n")},
	}
	ref := e.handle("t1", 2, same).result(t)
	if ref.Outcome != events.OutcomeFailure || ref.ErrorClass != events.ErrorClassRefused || !ref.Refused ||
		ref.RequestHash != r.RequestHash || ref.TokensIn != 0 || ref.Cost != 0 {
		t.Errorf("result %+v, want a refusal of hash %s without tokens", ref, r.RequestHash)
	}
	want := "refused: identical to a request that already failed deterministically (" + r.RequestHash[:12] + "); the request must change"
	if ref.Error != want {
		t.Errorf("error %q, want %q", ref.Error, want)
	}
	if n := e.model.Calls(); n != 1 {
		t.Fatalf("%d calls, want 1: the identical request must not reach the model", n)
	}
	if st := e.state("t1"); st.Refused != 1 {
		t.Errorf("refused count %d, want 1", st.Refused)
	}
	if n := e.counter("dispatch_executor_refused_total", map[string]string{"type": "css_fix"}); n != 1 {
		t.Errorf("refused metric %v, want 1", n)
	}

	// a changed request is sent
	changed := append(slices.Clone(testMessages), events.Message{Role: "user", Content: "The previous request failed: content must be a string."})
	if r := e.handle("t1", 3, changed).result(t); r.Outcome != events.OutcomeSuccess {
		t.Errorf("result %+v, want the changed request sent and answered", r)
	}
	if n := e.model.Calls(); n != 2 {
		t.Errorf("%d calls, want 2", n)
	}
}

// The deployment's faults — a refused key, an exhausted quota, a model or
// endpoint that does not exist, a prompt longer than the model's context —
// are called once, banned, and their error leads with what to fix, then
// everything the provider said.
func TestDeploymentErrorsAreCalledOnceAndSayWhatToFix(t *testing.T) {
	tests := []struct {
		name   string
		reply  openaitest.Reply
		path   string // appended to the base URL
		rules  map[int]events.ErrorClass
		class  events.ErrorClass
		fix    string // the error's start; {url} is the endpoint
		detail string // a part of what the provider said
	}{
		{"quota", status(http.StatusTooManyRequests, `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`), "", nil,
			events.ErrorClassQuota, "deployment: quota exhausted at {url} — raise the quota or the billing limit; ", "You exceeded your current quota"},
		{"401", status(http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided: sk-test.","type":"invalid_request_error","code":"invalid_api_key"}}`), "", nil,
			events.ErrorClassAuth, "deployment: the API key was refused (401) at {url} — check DISPATCH_OPENAI_API_KEY; ", "Incorrect API key provided"},
		{"403", status(http.StatusForbidden, `{"error":{"message":"Project does not have access to model gpt-4o","type":"invalid_request_error","code":"model_not_found"}}`), "", nil,
			events.ErrorClassAuth, `deployment: access to model "gpt-4o" was denied (403) at {url} — check the API key's permissions (DISPATCH_OPENAI_API_KEY) or set another model for the type; `, "does not have access"},
		{"404 model", status(http.StatusNotFound, `{"error":{"message":"The model `+"`gpt-4o`"+` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`), "", nil,
			events.ErrorClassConfig, `deployment: model "gpt-4o" not found at {url} — set the type's model in the policy or DISPATCH_MODEL; `, "does not exist"},
		{"404 endpoint", ok("never asked"), "/wrong", nil,
			events.ErrorClassConfig, "deployment: {url} has no chat-completions endpoint (404) — check DISPATCH_OPENAI_BASE_URL; ", "404 Not Found"},
		{"context length", status(http.StatusBadRequest, `{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9120 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`), "", nil,
			events.ErrorClassConfig, `deployment: the prompt (9120 tokens) exceeds the context (8192 tokens) of model "gpt-4o" — choose a model with a larger context or shorten the type's prompt (its template, the history it includes); `, "reduce the length"},
		{"context length without counts", status(http.StatusBadRequest, `{"error":{"message":"context_length_exceeded","type":"invalid_request_error"}}`), "", nil,
			events.ErrorClassConfig, `deployment: the prompt exceeds the context of model "gpt-4o" — `, "context_length_exceeded"},
		{"413 mapped to config", status(http.StatusRequestEntityTooLarge, "request entity too large"), "", map[int]events.ErrorClass{413: events.ErrorClassConfig},
			events.ErrorClassConfig, `deployment: {url} answered 413 Request Entity Too Large for model "gpt-4o", a configuration error (DISPATCH_ERROR_CLASSES) — `, "request entity too large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var url string
			e := newEnv(t, always(tt.reply), policy.Type{}, func(c *executor.Config) {
				c.Rules.Status = tt.rules
				url = strings.TrimSuffix(c.Model.(executor.Endpointer).Endpoint(), "/v1") + "/v1" + tt.path
				c.Model = executor.NewOpenAI(executor.OpenAIConfig{BaseURL: url, APIKey: "sk-test"})
			})
			r := e.handle("t1", 1, testMessages).result(t)
			if r.Outcome != events.OutcomeFailure || r.ErrorClass != tt.class || !events.ShortCircuits(r.ErrorClass) || !events.DeploymentFault(r.ErrorClass) {
				t.Errorf("result %+v, want a %s failure (the deployment's, short-circuits to a human)", r, tt.class)
			}
			if fix := strings.ReplaceAll(tt.fix, "{url}", url); !strings.HasPrefix(r.Error, fix) || !strings.Contains(r.Error, tt.detail) {
				t.Errorf("error\n%s\nwant it to start with\n%s\nand to contain %q", r.Error, fix, tt.detail)
			}
			want := 1
			if tt.path != "" {
				want = 0 // the fake records chat-completions requests only
			}
			if n := e.model.Calls(); n != want {
				t.Errorf("%d calls recorded, want exactly %d", n, want)
			}
			if st := e.state("t1"); !slices.Contains(st.FailedRequests, task.FailedEntry(r.RequestHash, 1)+"/"+string(tt.class)) {
				t.Errorf("failed requests %v lack %s with its class %s", st.FailedRequests, r.RequestHash, tt.class)
			}
		})
	}
}

func TestSameErrorRetryIsCounted(t *testing.T) {
	for name, body := range map[string]string{
		"short": badRequest,
		// Longer than the error an Executed keeps: compared as kept.
		"past the cap": `{"error":{"message":"` + strings.Repeat("invalid field; ", 2000) + `","type":"invalid_request_error"}}`,
	} {
		t.Run(name, func(t *testing.T) { sameErrorRetry(t, body) })
	}
}

func sameErrorRetry(t *testing.T, body string) {
	e := newEnv(t, always(status(http.StatusBadRequest, body)), policy.Type{}, nil)
	first := e.handle("t1", 1, testMessages).result(t)
	// the recorder keeps the failure as the task's last error
	e.edit("t1", func(st *events.TaskState) {
		st.LastError = first.Error
	})
	changed := append(slices.Clone(testMessages), events.Message{Role: "user", Content: "I will fix it."})
	second := e.handle("t1", 2, changed).result(t)
	if second.Error != first.Error || second.RequestHash == first.RequestHash {
		t.Fatalf("second failure %+v, want the same error for a different request", second)
	}
	if n := e.counter("dispatch_executor_same_error_retries_total", map[string]string{"type": "css_fix"}); n != 1 {
		t.Errorf("same-error retries %v, want 1", n)
	}
	if st := e.state("t1"); len(st.FailedRequests) != 2 {
		t.Errorf("failed requests %v, want both hashes", st.FailedRequests)
	}
}

func TestRefusalWithoutTaskStore(t *testing.T) {
	e := newEnv(t, always(status(http.StatusUnprocessableEntity, badRequest)), policy.Type{},
		func(c *executor.Config) { c.Tasks = nil })
	if r := e.handle("t1", 1, testMessages).result(t); r.ErrorClass != events.ErrorClassDeterministic {
		t.Fatalf("result %+v, want deterministic", r)
	}
	if r := e.handle("t1", 2, testMessages).result(t); r.ErrorClass != events.ErrorClassRefused {
		t.Errorf("result %+v, want refused from memory", r)
	}
	if n := e.model.Calls(); n != 1 {
		t.Errorf("%d calls, want 1", n)
	}
}

// A request refused before it is sent still bills what the attempt's
// earlier tries spent (TaskState.Unbilled, kept when a transient failure cut
// one short): the refusal's Result carries it to the recorder, and the
// ledger settles it once.
func TestRefusalBillsTheAttemptsEarlierSpend(t *testing.T) {
	e := newEnv(t, sequence(status(http.StatusBadRequest, badRequest)), policy.Type{}, nil)
	if r := e.handle("t1", 1, testMessages).result(t); r.ErrorClass != events.ErrorClassDeterministic {
		t.Fatalf("result %+v, want a deterministic failure", r)
	}
	spent := events.Usage{TokensIn: 120, TokensOut: 30, Cost: 0.0015}
	e.edit("t1", func(st *events.TaskState) {
		st.Unbilled = spent // a try of attempt 2 was cut short after spending this
	})
	ref := e.handle("t1", 2, testMessages).result(t)
	if !ref.Refused || ref.TokensIn != spent.TokensIn || ref.TokensOut != spent.TokensOut || ref.Cost != spent.Cost {
		t.Fatalf("refusal %+v, want it to bill the attempt's earlier spend %+v", ref, spent)
	}
	// Billed by the refusal's Result: unbilled until that is recorded (a
	// redelivery whose Executed was never stored bills it again).
	if st := e.state("t1"); st.Unbilled != spent {
		t.Fatalf("unbilled %+v after the refusal, want %+v until its Result is recorded", st.Unbilled, spent)
	}
	if n := e.model.Calls(); n != 1 {
		t.Fatalf("%d calls, want 1", n)
	}
}

// The deployment's faults that are not an HTTP status — an agent command
// or a command step that cannot start, an endpoint URL that cannot be
// called, a certificate the executor does not trust — and a request shape
// the endpoint rejects on every call: one try, class config (a human, the
// type's trust untouched), and an error that leads with what to fix.
func TestUnusableDeploymentIsConfigWithTheFix(t *testing.T) {
	tlsServer := httptest.NewTLSServer(http.NotFoundHandler()) // its certificate is nobody's
	t.Cleanup(tlsServer.Close)
	openAI := func(baseURL string) func(*executor.Config) {
		return func(c *executor.Config) {
			c.Model = executor.NewOpenAI(executor.OpenAIConfig{BaseURL: baseURL, APIKey: "sk-test"})
		}
	}
	tests := []struct {
		name  string
		pol   policy.Type
		cfg   func(*executor.Config)
		reply openaitest.Reply
		run   events.Run
		fix   string
		calls int
	}{
		{name: "agent not installed", pol: policy.Type{Executor: executor.ExecutorCommand, Command: []string{"no-such-agent-cli", "--print"}},
			fix: `deployment: the command "no-such-agent-cli --print" cannot run (exec: "no-such-agent-cli": executable file not found in $PATH) — install it where the executor runs`},
		{name: "agent the shell cannot find", pol: agent("cat >/dev/null; no-such-agent-cli --print", 0),
			fix: `deployment: the command "sh -c cat >/dev/null; no-such-agent-cli --print" cannot run (command exited with status 127: the shell cannot find it) — install it`},
		{name: "validator not installed", pol: pipeline("", 0, "/nonexistent/validator"), run: events.Run{Pass: 1, Attempt: 1, Step: "validate"},
			fix: `deployment: the command "/nonexistent/validator" cannot run (fork/exec /nonexistent/validator: no such file or directory) — install it`},
		{name: "bad URL scheme", cfg: openAI("htps://api.example/v1"),
			fix: `deployment: the endpoint URL "htps://api.example/v1/chat/completions" cannot be called — set DISPATCH_OPENAI_BASE_URL to an http:// or https:// URL with a host`},
		{name: "untrusted certificate", cfg: openAI(tlsServer.URL + "/v1"),
			fix: "deployment: the endpoint's TLS certificate is not trusted at " + tlsServer.URL + "/v1 — check the host name in DISPATCH_OPENAI_BASE_URL"},
		{name: "request shape", reply: status(http.StatusBadRequest, `{"error":{"message":"'response_format' of type 'json_object' is not supported with this model.","type":"invalid_request_error","param":"response_format","code":null}}`),
			fix: `deployment: {url} does not support the request's shape for model "gpt-4o" (400 Bad Request) — choose a model`, calls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reply := tt.reply
			if reply.Status == 0 {
				reply = ok("never asked")
			}
			e := newEnv(t, always(reply), tt.pol, tt.cfg)
			run := tt.run
			if run.Pass == 0 {
				run = events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Step: "execute"}
			}
			r := e.handleRun("t1", run, testMessages).result(t)
			if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassConfig || !events.DeploymentFault(r.ErrorClass) {
				t.Errorf("result %+v, want a config failure (the deployment's)", r)
			}
			if fix := strings.ReplaceAll(tt.fix, "{url}", e.model.BaseURL()); !strings.HasPrefix(r.Error, fix) {
				t.Errorf("error\n%s\nwant it to start with\n%s", r.Error, fix)
			}
			if n := e.model.Calls(); n != tt.calls {
				t.Errorf("%d model calls, want %d", n, tt.calls)
			}
		})
	}
}
