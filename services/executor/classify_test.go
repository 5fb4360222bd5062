package executor_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	openai "github.com/sashabaranov/go-openai"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// provider is a *ProviderError as OpenAI.Complete returns it for an
// OpenAI-style error object.
func provider(status int, code any, typ, message string, header ...string) error {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return &executor.ProviderError{Model: "gpt-4o", StatusCode: status, Header: h,
		Err: &openai.APIError{HTTPStatusCode: status, Code: code, Type: typ, Message: message}}
}

// rawProvider is a *ProviderError for a body that is not an error object.
func rawProvider(status int, body string) error {
	return &executor.ProviderError{Model: "gpt-4o", StatusCode: status,
		Err: &openai.RequestError{HTTPStatusCode: status, Body: []byte(body), Err: errors.New("invalid character")}}
}

func TestClassify(t *testing.T) {
	now := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	defaults := executor.Rules{Now: func() time.Time { return now }}
	T, D, A, Q, C := events.ErrorClassTransient, events.ErrorClassDeterministic, events.ErrorClassAuth, events.ErrorClassQuota, events.ErrorClassConfig
	tests := []struct {
		name       string
		err        error
		rules      *executor.Rules
		class      events.ErrorClass
		retryAfter time.Duration
	}{
		{"nil", nil, nil, "", 0},
		// HTTP statuses
		{"500", provider(500, nil, "server_error", "The server had an error"), nil, T, 0},
		{"502 html", rawProvider(502, "<html>bad gateway</html>"), nil, T, 0},
		{"503 retry-after seconds", provider(503, nil, "", "overloaded", "Retry-After", "2"), nil, T, 2 * time.Second},
		{"503 retry-after fraction", provider(503, nil, "", "overloaded", "Retry-After", "1.5"), nil, T, 1500 * time.Millisecond},
		{"503 retry-after date", provider(503, nil, "", "overloaded", "Retry-After", now.Add(90*time.Second).Format(http.TimeFormat)), nil, T, 90 * time.Second},
		{"503 retry-after date passed", provider(503, nil, "", "overloaded", "Retry-After", now.Add(-time.Hour).Format(http.TimeFormat)), nil, T, 0},
		{"503 retry-after garbage", provider(503, nil, "", "overloaded", "Retry-After", "soon"), nil, T, 0},
		{"503 retry-after negative", provider(503, nil, "", "overloaded", "Retry-After", "-3"), nil, T, 0},
		{"503 retry-after-ms", provider(503, nil, "", "overloaded", "Retry-After-Ms", "250"), nil, T, 250 * time.Millisecond},
		{"504", rawProvider(504, ""), nil, T, 0},
		{"408", provider(408, nil, "", "request timeout"), nil, T, 0},
		{"400", provider(400, "invalid_value", "invalid_request_error", "Invalid value"), nil, D, 0},
		{"404 model", provider(404, "model_not_found", "invalid_request_error", "The model `gpt-5x` does not exist or you do not have access to it."), nil, C, 0},
		{"404 endpoint", rawProvider(404, "404 page not found"), nil, C, 0},
		{"400 context length", provider(400, "context_length_exceeded", "invalid_request_error", "This model's maximum context length is 8192 tokens. However, your messages resulted in 9120 tokens."), nil, C, 0},
		{"400 context length vllm", rawProvider(400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","code":400}`), nil, C, 0},
		{"400 other", provider(400, "invalid_value", "invalid_request_error", "max_tokens is too large"), nil, D, 0},
		{"409", provider(409, nil, "", "conflict"), nil, D, 0},
		{"422", rawProvider(422, `{"detail":"unprocessable"}`), nil, D, 0},
		{"401", provider(401, "invalid_api_key", "invalid_request_error", "Incorrect API key provided"), nil, A, 0},
		{"403", provider(403, nil, "", "forbidden"), nil, A, 0},
		// 429: body and headers decide
		{"429 rate limit code", provider(429, "rate_limit_exceeded", "requests", "Rate limit reached for gpt-4o", "Retry-After", "7"), nil, T, 7 * time.Second},
		{"429 rate limit message", provider(429, nil, "", "Rate limit reached for requests"), nil, T, 0},
		{"429 retry-after only", provider(429, nil, "", "slow down", "Retry-After", "3"), nil, T, 3 * time.Second},
		{"429 plain", rawProvider(429, "too many requests"), nil, T, 0},
		{"429 insufficient_quota", provider(429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota, please check your plan and billing details."), nil, Q, 0},
		{"429 quota message", provider(429, nil, "", "Monthly quota exhausted"), nil, Q, 0},
		{"429 quota raw body", rawProvider(429, `quota exhausted for this key`), nil, Q, 0},
		{"429 quota despite retry-after", provider(429, "insufficient_quota", "", "quota", "Retry-After", "86400"), nil, Q, 0},
		{"429 per-minute quota with retry-after", provider(429, nil, "", "Quota exceeded for requests per minute", "Retry-After", "30"), nil, T, 30 * time.Second},
		// overrides
		{"override 404 transient", provider(404, nil, "", "not yet"), &executor.Rules{Status: map[int]events.ErrorClass{404: T}}, T, 0},
		{"override 500 deterministic", provider(500, nil, "", "bad input crashes the server"), &executor.Rules{Status: map[int]events.ErrorClass{500: D}}, D, 0},
		{"override 429 quota", provider(429, nil, "", "slow down", "Retry-After", "3"), &executor.Rules{Status: map[int]events.ErrorClass{429: Q}}, Q, 0},
		{"custom quota body", provider(429, nil, "", "billing hard limit reached"), &executor.Rules{QuotaBody: []string{"Billing Hard Limit"}}, Q, 0},
		{"override 413 config", rawProvider(413, "request entity too large"), &executor.Rules{Status: map[int]events.ErrorClass{413: C}}, C, 0},
		{"override 404 deterministic", provider(404, "model_not_found", "", "no such model"), &executor.Rules{Status: map[int]events.ErrorClass{404: D}}, D, 0},
		{"custom context body", provider(400, nil, "", "prompt is too long: 210000 tokens > 200000 maximum"), &executor.Rules{ContextLengthBody: []string{"prompt is too long"}}, C, 0},
		{"custom bodies replace defaults", provider(429, nil, "", "quota per minute"), &executor.Rules{RateLimitBody: []string{"per minute"}}, T, 0},
		// tools (micro error codes)
		{"tool 400", &executor.ToolError{Tool: "x", Code: 400, Description: "missing required field", Body: []byte(`{"field":"email"}`)}, nil, D, 0},
		{"tool 401", &executor.ToolError{Tool: "x", Code: 401, Description: "unauthorized"}, nil, A, 0},
		{"tool 404", &executor.ToolError{Tool: "x", Code: 404, Description: "no such user", Body: []byte(`{"model":"user"}`)}, nil, D, 0},
		{"tool 400 context words", &executor.ToolError{Tool: "x", Code: 400, Description: "maximum context length"}, nil, D, 0},
		{"tool 503", &executor.ToolError{Tool: "x", Code: 503, Description: "backend down"}, nil, T, 0},
		{"tool 429 quota", &executor.ToolError{Tool: "x", Code: 429, Body: []byte(`{"error":"daily quota used up"}`)}, nil, Q, 0},
		{"no responders", fmt.Errorf("tool x: %w", nats.ErrNoResponders), nil, T, 0},
		{"nats timeout", fmt.Errorf("tool x: %w", nats.ErrTimeout), nil, T, 0},
		// transport
		{"call deadline", &executor.ProviderError{Model: "m", Err: &url.Error{Op: "Post", URL: "http://x", Err: context.DeadlineExceeded}}, nil, T, 0},
		{"connection refused", &executor.ProviderError{Model: "m", Err: &url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}}, nil, T, 0},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, nil, T, 0},
		{"unexpected EOF", fmt.Errorf("read body: %w", io.ErrUnexpectedEOF), nil, T, 0},
		{"dns", &net.DNSError{Err: "no such host", Name: "api.example", IsNotFound: true}, nil, T, 0},
		{"os deadline", os.ErrDeadlineExceeded, nil, T, 0},
		// commands
		{"command timeout", &executor.CommandError{ExitCode: -1, TimedOut: true}, nil, events.ErrorClassTimeout, 0},
		{"command exit 75", &executor.CommandError{ExitCode: 75}, nil, T, 0},
		{"command exit 2", &executor.CommandError{ExitCode: 2}, nil, D, 0},
		{"command not found", &executor.CommandError{ExitCode: -1, Err: errors.New("executable file not found")}, nil, C, 0},
		{"command at its CPU time limit", &executor.CommandError{ExitCode: -1, Killed: true, CPULimit: time.Second}, nil, D, 0},
		{"command killed by a signal", &executor.CommandError{ExitCode: -1, Killed: true, Err: errors.New("signal: segmentation fault")}, nil, D, 0},
		// nothing known
		{"200 without choices", &executor.ProviderError{Model: "m", StatusCode: 200, Err: errors.New("the answer has no choices")}, nil, events.ErrorClassModel, 0},
		{"other", errors.New("something odd"), nil, events.ErrorClassModel, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := defaults
			if tt.rules != nil {
				rules = *tt.rules
				rules.Now = defaults.Now
			}
			c := executor.Classify(tt.err, rules)
			if c.Class != tt.class || c.RetryAfter != tt.retryAfter {
				t.Errorf("Classify = %+v, want class %q retry after %v", c, tt.class, tt.retryAfter)
			}
			if tt.err != nil && c.Reason == "" {
				t.Errorf("no reason given")
			}
		})
	}
}

// The deployment's faults are config — a human fixes them, the type's
// trust never sees them — however they reach the executor: an agent
// command that cannot start, a request shape the endpoint rejects on every
// call, an endpoint URL that cannot be called, a certificate that is not
// trusted. A tool's 400 stays the model's mistake.
func TestClassifyDeploymentFaults(t *testing.T) {
	C, D := events.ErrorClassConfig, events.ErrorClassDeterministic
	notFound := &exec.Error{Name: "claude", Err: exec.ErrNotFound}
	tests := []struct {
		name  string
		err   error
		class events.ErrorClass
	}{
		{"agent not on PATH", &executor.CommandError{Argv: []string{"claude"}, ExitCode: -1, Err: notFound}, C},
		{"agent path missing", &executor.CommandError{Argv: []string{"/opt/agent"}, ExitCode: -1, Err: &fs.PathError{Op: "fork/exec", Path: "/opt/agent", Err: syscall.ENOENT}}, C},
		{"agent not executable", &executor.CommandError{Argv: []string{"./agent"}, ExitCode: -1, Err: &fs.PathError{Op: "fork/exec", Path: "./agent", Err: syscall.EACCES}}, C},
		{"no command configured", &executor.CommandError{ExitCode: -1, Err: errors.New("no command configured")}, C},
		{"shell: command not found (127)", &executor.CommandError{Argv: []string{"sh", "-c", "claude"}, ExitCode: 127, Output: "sh: 1: claude: not found"}, C},
		{"shell: cannot execute (126)", &executor.CommandError{Argv: []string{"sh", "-c", "./agent"}, ExitCode: 126}, C},
		{"unsupported parameter", provider(400, "unsupported_parameter", "invalid_request_error", "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."), C},
		{"unsupported value", provider(400, "unsupported_value", "invalid_request_error", "Unsupported value: 'temperature' does not support 0.2 with this model."), C},
		{"json mode unsupported", provider(400, nil, "invalid_request_error", "'response_format' of type 'json_object' is not supported with this model."), C},
		{"ollama without tools", rawProvider(400, `{"error":"registry.ollama.ai/library/gemma:2b does not support tools"}`), C},
		{"vllm without tool parser", rawProvider(400, `{"object":"error","message":"\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set","type":"BadRequestError","code":400}`), C},
		{"unknown argument", provider(400, nil, "invalid_request_error", "Unrecognized request argument supplied: tool_choice"), C},
		{"bad URL scheme", &executor.ProviderError{Model: "m", Err: &url.Error{Op: "Post", URL: "htps://api.example/v1/chat/completions", Err: errors.New("unsupported protocol scheme \"htps\"")}}, C},
		{"URL without a host", &executor.ProviderError{Model: "m", Err: &url.Error{Op: "Post", URL: "http:///v1/chat/completions", Err: errors.New("http: no Host in request URL")}}, C},
		{"unknown authority", &executor.ProviderError{Model: "m", Err: &url.Error{Op: "Post", URL: "https://llm.internal/v1/chat/completions", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}}, C},
		{"wrong host name", &executor.ProviderError{Model: "m", Err: &url.Error{Op: "Post", URL: "https://10.0.0.7/v1/chat/completions", Err: x509.HostnameError{Certificate: &x509.Certificate{}, Host: "10.0.0.7"}}}, C},
		{"expired certificate", &executor.ProviderError{Model: "m", Err: &url.Error{Op: "Post", URL: "https://llm.internal/v1", Err: x509.CertificateInvalidError{Reason: x509.Expired}}}, C},
		{"https to an http server", &executor.ProviderError{Model: "m", Err: &url.Error{Op: "Post", URL: "https://localhost:11434/v1", Err: http.ErrSchemeMismatch}}, C},
		{"tool 400 not supported", &executor.ToolError{Tool: "x", Code: 400, Description: "sorting is not supported"}, D},
		{"plain 400", provider(400, "invalid_value", "invalid_request_error", "Invalid value for 'content'"), D},
		{"agent exit 1", &executor.CommandError{Argv: []string{"claude"}, ExitCode: 1}, D},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c := executor.Classify(tt.err, executor.Rules{}); c.Class != tt.class || c.Reason == "" {
				t.Errorf("Classify = %+v, want class %q with a reason", c, tt.class)
			}
		})
	}
}

// A 429 is a spent quota only when its body says so (insufficient_quota,
// "exceeded your current quota", "quota exhausted", a daily or monthly
// quota, billing): the word "quota" alone — a per-minute quota — is a
// window that reopens. A Retry-After is honoured up to MaxRetryAfter.
func TestClassify429AndRetryAfter(t *testing.T) {
	T, Q := events.ErrorClassTransient, events.ErrorClassQuota
	tests := []struct {
		name       string
		err        error
		rules      executor.Rules
		class      events.ErrorClass
		retryAfter time.Duration
	}{
		{"per-minute quota, no Retry-After", provider(429, nil, "", "Quota exceeded for quota metric 'Generate Content API requests per minute'"), executor.Rules{}, T, 0},
		{"bare quota word", rawProvider(429, `{"error":"quota"}`), executor.Rules{}, T, 0},
		{"insufficient_quota", provider(429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota, please check your plan and billing details."), executor.Rules{}, Q, 0},
		{"exceeded your current quota", rawProvider(429, "You exceeded your current quota"), executor.Rules{}, Q, 0},
		{"daily quota", rawProvider(429, `{"error":"daily quota used up"}`), executor.Rules{}, Q, 0},
		{"monthly quota", provider(429, nil, "", "Monthly quota exhausted"), executor.Rules{}, Q, 0},
		{"billing hard limit", provider(429, "billing_hard_limit_reached", "", "Billing hard limit has been reached"), executor.Rules{}, Q, 0},
		{"a long Retry-After is capped", provider(503, nil, "", "maintenance", "Retry-After", "86400"), executor.Rules{}, T, executor.DefaultMaxRetryAfter},
		{"a long Retry-After date is capped", provider(503, nil, "", "maintenance", "Retry-After", "Tue, 19 May 2026 14:00:00 GMT"), executor.Rules{}, T, executor.DefaultMaxRetryAfter},
		{"a long retry-after-ms is capped", provider(429, nil, "", "slow down", "Retry-After-Ms", "7200000"), executor.Rules{}, T, executor.DefaultMaxRetryAfter},
		{"the type's own cap", provider(429, nil, "", "slow down", "Retry-After", "120"), executor.Rules{MaxRetryAfter: time.Minute}, T, time.Minute},
		{"a short Retry-After stands", provider(429, nil, "", "slow down", "Retry-After", "30"), executor.Rules{}, T, 30 * time.Second},
	}
	now := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := tt.rules
			rules.Now = func() time.Time { return now }
			if c := executor.Classify(tt.err, rules); c.Class != tt.class || c.RetryAfter != tt.retryAfter {
				t.Errorf("Classify = %+v, want class %q retry after %v", c, tt.class, tt.retryAfter)
			}
		})
	}
}

func ExampleClassify() {
	quota := &executor.ProviderError{Model: "gpt-4o", StatusCode: 429, Err: &openai.APIError{
		HTTPStatusCode: 429, Code: "insufficient_quota", Message: "You exceeded your current quota",
	}}
	limited := &executor.ProviderError{Model: "gpt-4o", StatusCode: 429, Header: http.Header{"Retry-After": {"2"}},
		Err: &openai.APIError{HTTPStatusCode: 429, Message: "slow down"}}
	for _, err := range []error{quota, limited, &executor.ToolError{Tool: "create_user", Code: 400}} {
		c := executor.Classify(err, executor.Rules{})
		fmt.Printf("%s %v (%s)\n", c.Class, c.RetryAfter, c.Reason)
	}
	// Output:
	// quota 0s (status 429: quota exhausted)
	// transient 2s (status 429 with Retry-After, retry after 2s)
	// deterministic 0s (status 400)
}

func FuzzClassifyRetryAfter(f *testing.F) {
	for _, s := range []string{"2", "1.5", "-1", "1e400", "NaN", "Inf", "Mon, 18 May 2026 14:01:30 GMT", "", " 7 ", "0x10"} {
		f.Add(s, s)
	}
	now := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, retryAfter, retryAfterMs string) {
		err := &executor.ProviderError{Model: "m", StatusCode: 503,
			Header: http.Header{"Retry-After": {retryAfter}, "Retry-After-Ms": {retryAfterMs}},
			Err:    &openai.APIError{HTTPStatusCode: 503, Message: "down"}}
		c := executor.Classify(err, executor.Rules{Now: func() time.Time { return now }})
		if c.Class != events.ErrorClassTransient || c.RetryAfter < 0 {
			t.Fatalf("Classify = %+v", c)
		}
	})
}
