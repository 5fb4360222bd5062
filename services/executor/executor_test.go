package executor_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	openai "github.com/sashabaranov/go-openai"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// cssPolicy routes css_fix to gpt-4o.
var cssPolicy = policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": {Model: "gpt-4o"}}})

var prices = map[string]executor.Price{"gpt-4o": {InputPerMTok: 2.5, OutputPerMTok: 10}}

func openAIService(t *testing.T, f *fakeOpenAI) *executor.Service {
	t.Helper()
	s, _ := newService(t, executor.Config{
		Model:  executor.NewOpenAI(executor.OpenAIConfig{BaseURL: f.BaseURL(), APIKey: "sk-test"}),
		Policy: cssPolicy,
		Prices: prices,
	})
	return s
}

func TestHandleSuccess(t *testing.T) {
	content := "Here is the result:\n```json\n" +
		`{"status":"success","approach":"moved the rule into .btn","summary":"colour fixed","changes":["app.css: .btn colour"]}` +
		"\n```\nDone."
	f := newFakeOpenAI(t, answer(content, 1000, 500))
	s := openAIService(t, f)

	outs, err := s.Handle(context.Background(), prompted(t, "t1", "css_fix", "", 1))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	got := executed(t, "t1", 1, outs).Result
	want := events.Result{
		Outcome: events.OutcomeSuccess, Approach: "moved the rule into .btn", Summary: "colour fixed",
		Changes: []string{"app.css: .btn colour"}, Model: "gpt-4o", TokensIn: 1000, TokensOut: 500,
		Cost: got.Cost, RequestHash: executor.RequestHash(executor.Request{
			Model: "gpt-4o", Messages: executor.PromptMessages(testMessages), ResponseFormat: executor.ResponseFormatJSON,
		}),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("result\n got %+v\nwant %+v", got, want)
	}
	if math.Abs(got.Cost-0.0075) > 1e-12 { // 1000 × 2.5/M + 500 × 10/M
		t.Errorf("cost %v, want 0.0075", got.Cost)
	}

	reqs := f.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	req := reqs[0]
	if req.Model != "gpt-4o" {
		t.Errorf("requested model %q, want the policy's gpt-4o", req.Model)
	}
	if !reflect.DeepEqual(req.Messages, testMessages) {
		t.Errorf("messages\n got %#v\nwant %#v", req.Messages, testMessages)
	}
	if req.ResponseFormat == nil || req.ResponseFormat.Type != "json_object" {
		t.Errorf("response_format %+v, want json_object", req.ResponseFormat)
	}
	if _, ok := req.Raw["temperature"]; ok {
		t.Errorf("temperature sent (%s), want the provider's default", req.Raw["temperature"])
	}
}

func TestHandleModelChoice(t *testing.T) {
	tests := []struct {
		name, taskType, promptModel, defaultModel, want string
	}{
		{"prompt wins over policy", "css_fix", "gpt-4.1", "", "gpt-4.1"},
		{"policy", "css_fix", "", "llama3", "gpt-4o"},
		{"configured default", "other", "", "llama3", "llama3"},
		{"built-in default", "other", "", "", executor.DefaultModel},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeOpenAI(t, answer(`{"status":"success","approach":"a"}`, 1, 1))
			s, _ := newService(t, executor.Config{
				Model:        executor.NewOpenAI(executor.OpenAIConfig{BaseURL: f.BaseURL()}),
				Policy:       cssPolicy,
				DefaultModel: tt.defaultModel,
			})
			if _, err := s.Handle(context.Background(), prompted(t, "t1", tt.taskType, tt.promptModel, 1)); err != nil {
				t.Fatalf("Handle: %v", err)
			}
			if reqs := f.Requests(); len(reqs) != 1 || reqs[0].Model != tt.want {
				t.Errorf("requests %+v, want one for model %q", reqs, tt.want)
			}
		})
	}
}

func TestHandleModelReportsFailure(t *testing.T) {
	f := newFakeOpenAI(t, answer(`{"status":"failure","approach":"null check in handleResponse","summary":"the bug is elsewhere"}`, 10, 20))
	s := openAIService(t, f)

	outs, err := s.Handle(context.Background(), prompted(t, "t2", "css_fix", "", 2))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	r := executed(t, "t2", 2, outs).Result
	if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassTask ||
		r.Error != "the bug is elsewhere" || r.Approach != "null check in handleResponse" {
		t.Errorf("result %+v, want a task failure carrying the summary and approach", r)
	}
	if r.TokensIn != 10 || r.TokensOut != 20 || r.Cost == 0 {
		t.Errorf("tokens %d/%d cost %v, want 10/20 and a cost", r.TokensIn, r.TokensOut, r.Cost)
	}
}

func TestHandleUnparseableAnswer(t *testing.T) {
	f := newFakeOpenAI(t, answer("I could not finish, sorry.", 10, 5))
	s := openAIService(t, f)

	outs, err := s.Handle(context.Background(), prompted(t, "t3", "css_fix", "", 1))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	r := executed(t, "t3", 1, outs).Result
	if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassInvalidOutput {
		t.Errorf("result %+v, want an invalid_output failure", r)
	}
	if !strings.Contains(r.Error, "no JSON object") || !strings.Contains(r.Error, "I could not finish, sorry.") {
		t.Errorf("error %q should say what is wrong and quote the answer", r.Error)
	}
	if r.TokensIn != 10 || r.TokensOut != 5 {
		t.Errorf("tokens %d/%d, want 10/5: an invalid answer still cost tokens", r.TokensIn, r.TokensOut)
	}
}

func TestHandleHTTPError(t *testing.T) {
	quota := reply{status: http.StatusTooManyRequests,
		body: `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","code":"insufficient_quota"}}`}
	tests := []struct {
		name   string
		reply  reply
		class  events.ErrorClass // "" means a snooze
		inText string
	}{
		{"500", apiError(http.StatusInternalServerError, "the server had an error"), "", "the server had an error"},
		{"502 not JSON", reply{status: http.StatusBadGateway, body: "<html>bad gateway</html>"}, "", "502"},
		{"400", apiError(http.StatusBadRequest, "messages: missing required field"), events.ErrorClassDeterministic, "missing required field"},
		{"404", apiError(http.StatusNotFound, "The model `gpt-4o` does not exist"), events.ErrorClassConfig, "does not exist"},
		{"422", apiError(http.StatusUnprocessableEntity, "unprocessable"), events.ErrorClassDeterministic, "422 Unprocessable Entity"},
		{"401", apiError(http.StatusUnauthorized, "Incorrect API key provided"), events.ErrorClassAuth, "Incorrect API key"},
		{"403", apiError(http.StatusForbidden, "not allowed"), events.ErrorClassAuth, "not allowed"},
		{"429 quota", quota, events.ErrorClassQuota, `"code":"insufficient_quota"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeOpenAI(t, tt.reply, answer(`{"status":"success","approach":"a"}`, 1, 1))
			s := openAIService(t, f)

			outs, err := s.Handle(context.Background(), prompted(t, "t4", "css_fix", "", 1))
			if n := len(f.Requests()); n != 1 {
				t.Errorf("%d requests, want exactly 1 (no blind retry)", n)
			}
			if tt.class == "" {
				var snooze *services.SnoozeError
				if !errors.As(err, &snooze) || outs != nil || !strings.Contains(err.Error(), tt.inText) {
					t.Fatalf("Handle = %v, %v; want a snooze carrying %q and no Executed", outs, err, tt.inText)
				}
				return
			}
			if err != nil {
				t.Fatalf("Handle: %v", err)
			}
			r := executed(t, "t4", 1, outs).Result
			if r.Outcome != events.OutcomeFailure || r.ErrorClass != tt.class || r.Model != "gpt-4o" || r.RequestHash == "" {
				t.Errorf("result %+v, want a %s failure of gpt-4o with its request hash", r, tt.class)
			}
			if !strings.Contains(r.Error, tt.inText) {
				t.Errorf("error %q does not carry %q", r.Error, tt.inText)
			}
		})
	}
}

func TestOpenAIErrorsStayReachable(t *testing.T) {
	rateLimited := apiError(http.StatusTooManyRequests, "slow down")
	rateLimited.header = http.Header{"Retry-After": {"7"}}
	f := newFakeOpenAI(t, rateLimited, reply{status: http.StatusServiceUnavailable, body: "upstream down"})
	m := executor.NewOpenAI(executor.OpenAIConfig{BaseURL: f.BaseURL()})
	req := executor.Request{Model: "gpt-4o", Messages: executor.PromptMessages(testMessages)}

	_, err := m.Complete(context.Background(), req)
	var pe *executor.ProviderError
	var apiErr *openai.APIError
	if !errors.As(err, &pe) || !errors.As(err, &apiErr) {
		t.Fatalf("429: %v (%T), want a *ProviderError wrapping an *openai.APIError", err, err)
	}
	if pe.StatusCode != http.StatusTooManyRequests || pe.Header.Get("Retry-After") != "7" || pe.Model != "gpt-4o" {
		t.Errorf("provider error %+v, want status 429 with Retry-After 7", pe)
	}
	if apiErr.HTTPStatusCode != http.StatusTooManyRequests || apiErr.Message != "slow down" {
		t.Errorf("api error %+v", apiErr)
	}

	_, err = m.Complete(context.Background(), req)
	var reqErr *openai.RequestError
	if !errors.As(err, &reqErr) || reqErr.HTTPStatusCode != http.StatusServiceUnavailable || string(reqErr.Body) != "upstream down" {
		t.Fatalf("503: %v (%T), want an *openai.RequestError with the body", err, err)
	}
}

func TestHandleCancelledIsNotAnAttempt(t *testing.T) {
	f := newFakeOpenAI(t, reply{block: true})
	s := openAIService(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type handled struct {
		outs []services.Out
		err  error
	}
	done := make(chan handled, 1)
	go func() {
		outs, err := s.Handle(ctx, prompted(t, "t5", "css_fix", "", 1))
		done <- handled{outs, err}
	}()
	<-f.received // the call is in flight
	cancel()
	got := <-done
	if !errors.Is(got.err, context.Canceled) || got.outs != nil {
		t.Errorf("Handle = %v, %v; want context.Canceled and no Executed", got.outs, got.err)
	}
}

func TestHandleModelTimeoutIsTransient(t *testing.T) {
	f := newFakeOpenAI(t, reply{block: true})
	s, _ := newService(t, executor.Config{
		Model: executor.NewOpenAI(executor.OpenAIConfig{BaseURL: f.BaseURL(), Timeout: time.Millisecond}),
	})

	outs, err := s.Handle(context.Background(), prompted(t, "t6", "css_fix", "", 1))
	var snooze *services.SnoozeError
	if !errors.As(err, &snooze) || outs != nil {
		t.Fatalf("Handle = %v, %v; want a snooze: the model's own timeout is transient, not a shutdown", outs, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || snooze.Delay != 500*time.Millisecond {
		t.Errorf("snooze %v for %v, want the deadline error and half the 1s backoff ceiling (jitter 0.5)", err, snooze.Delay)
	}
}

func TestHandleRejectsBadInput(t *testing.T) {
	s, _ := newService(t, executor.Config{Model: executor.Simulated{}})
	noMessages := prompted(t, "t7", "css_fix", "", 1)
	noMessages.Data = []byte(`{"task":{"id":"t7","type":"css_fix"},"run":{"pass":1,"attempt":1},"prompt":{"messages":[]}}`)
	tests := map[string]*services.Msg{
		"undecodable": {Subject: "dispatch.task.t7.prompted", Data: []byte("{not json")},
		"no messages": noMessages,
		"bad task id": {Subject: "dispatch.task.x.prompted", Data: []byte(`{"task":{"id":"a.b"},"prompt":{"messages":[{"role":"user","content":"x"}]}}`)},
	}
	for name, m := range tests {
		t.Run(name, func(t *testing.T) {
			outs, err := s.Handle(context.Background(), m)
			var dead *services.DeadError
			if !errors.As(err, &dead) || dead.Reason != events.ReviewPoison || outs != nil {
				t.Errorf("Handle = %v, %v; want a poison DeadError and nothing published", outs, err)
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	_, err := executor.New(executor.Config{
		Prices:  map[string]executor.Price{"x": {InputPerMTok: -1}},
		Rules:   executor.Rules{Status: map[int]events.ErrorClass{418: "teapot"}},
		Backoff: executor.Backoff{Factor: 0.5},
		Circuit: executor.CircuitConfig{CoolDown: -time.Second},
	})
	for _, want := range []string{"Model is required", `price of "x"`, "Rules.Status[418]", "Backoff", "cool-downs"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v, want %q among the problems", err, want)
		}
	}
	if _, err := executor.New(executor.Config{Model: executor.Simulated{}}); err != nil {
		t.Errorf("New with only a model: %v", err)
	}
}

func TestTwoExecutorsShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := executor.New(executor.Config{Model: executor.Simulated{}, Registry: reg}); err != nil {
			t.Fatalf("New: %v", err)
		}
	}
}
