package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	openai "github.com/sashabaranov/go-openai"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Default body markers of a 429 answer, and of a 400 saying the prompt is
// longer than the model's context (Rules).
var (
	DefaultRateLimitBody     = []string{"rate_limit_exceeded", "rate limit"}
	DefaultQuotaBody         = []string{"insufficient_quota", "quota"}
	DefaultContextLengthBody = []string{"context_length_exceeded", "maximum context length"}
)

// Rules tune Classify. The zero value is the built-in mapping.
type Rules struct {
	// Status gives the class of a status code (an HTTP status, a tool's
	// Nats-Service-Error-Code), overriding the built-in mapping: 401 and 403
	// auth; 408 and 5xx transient; 429 read from its body and headers; a
	// model's 404 (no such model or endpoint) config, and its 400 config
	// when the body says the context is exceeded (ContextLengthBody); other
	// 4xx deterministic. Default: no overrides.
	Status map[int]events.ErrorClass
	// RateLimitBody are substrings (case-insensitive) of a 429 answer that
	// make it a transient rate limit; they are looked for before QuotaBody.
	// Default DefaultRateLimitBody.
	RateLimitBody []string
	// QuotaBody are substrings (case-insensitive) of a 429 answer saying the
	// quota is exhausted: ErrorClassQuota. Default DefaultQuotaBody. A 429
	// matching neither is transient.
	QuotaBody []string
	// ContextLengthBody are substrings (case-insensitive) of a model's 400
	// answer saying the prompt exceeds the model's context: ErrorClassConfig.
	// Default DefaultContextLengthBody.
	ContextLengthBody []string
	// Now is the clock a Retry-After HTTP date is read against. Default time.Now.
	Now func() time.Time
}

// Classification is what Classify found.
type Classification struct {
	// Class is an events.ErrorClass*: transient, deterministic, auth, quota,
	// config (the model or endpoint does not exist, the prompt exceeds the
	// context), timeout (an agent command timed out), or model when nothing
	// is known.
	Class events.ErrorClass
	// RetryAfter is the delay the answer asked for (Retry-After,
	// retry-after-ms); zero when it gave none.
	RetryAfter time.Duration
	// Reason says in a few words why the error got its class.
	Reason string
}

// Classify sorts a model, tool or command error into the class that decides
// what the executor does with it. It reads the status code, headers and body
// of a *ProviderError (or a bare *openai.APIError / *openai.RequestError),
// the code of a *ToolError, the exit of a *CommandError, and network,
// context and NATS errors. A nil error has the empty class.
func Classify(err error, rules Rules) Classification {
	if err == nil {
		return Classification{}
	}
	var ce *CommandError
	if errors.As(err, &ce) {
		return classifyCommand(ce)
	}
	if status, header, body, tool := errorDetails(err); status != 0 {
		return rules.byStatus(status, header, body, !tool)
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return transient("no responders")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded):
		return transient("timeout")
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE):
		return transient("connection reset")
	case errors.Is(err, syscall.ECONNREFUSED):
		return transient("connection refused")
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return transient("connection closed")
	case errors.Is(err, context.Canceled):
		return transient("cancelled")
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		if netErr.Timeout() {
			return transient("timeout")
		}
		return transient("network error")
	}
	return Classification{Class: events.ErrorClassModel, Reason: "unclassified error"}
}

func transient(reason string) Classification {
	return Classification{Class: events.ErrorClassTransient, Reason: reason}
}

func classifyCommand(e *CommandError) Classification {
	switch {
	case e.TimedOut:
		return Classification{Class: events.ErrorClassTimeout, Reason: "command timed out"}
	case e.ExitCode == ExitTempFail:
		return transient("command exited with EX_TEMPFAIL (75)")
	case e.ExitCode >= 0:
		return Classification{Class: events.ErrorClassDeterministic, Reason: fmt.Sprintf("command exited with status %d", e.ExitCode)}
	}
	return Classification{Class: events.ErrorClassDeterministic, Reason: "command could not run"}
}

// errorDetails digs the status, headers and body text out of err; tool
// says they are a tool's, not a model endpoint's.
func errorDetails(err error) (status int, header http.Header, body string, tool bool) {
	var pe *ProviderError
	if errors.As(err, &pe) {
		status, header = pe.StatusCode, pe.Header
	}
	var apiErr *openai.APIError
	var reqErr *openai.RequestError
	var toolErr *ToolError
	switch {
	case errors.As(err, &apiErr):
		if status == 0 {
			status = apiErr.HTTPStatusCode
		}
		param := ""
		if apiErr.Param != nil {
			param = *apiErr.Param
		}
		body = fmt.Sprintf("%v %s %s %s", apiErr.Code, apiErr.Type, param, apiErr.Message)
	case errors.As(err, &reqErr):
		if status == 0 {
			status = reqErr.HTTPStatusCode
		}
		body = string(reqErr.Body)
	case errors.As(err, &toolErr):
		status, body, tool = toolErr.Code, toolErr.Description+" "+string(toolErr.Body), true
	}
	if status >= 200 && status < 300 {
		status = 0 // an answer that arrived but could not be used: not an HTTP error
	}
	return status, header, body, tool
}

// byStatus classifies an error status; model says it is a model endpoint's
// answer (a tool's 404 is the model's mistake, not the deployment's).
func (r Rules) byStatus(status int, header http.Header, body string, model bool) Classification {
	reason := fmt.Sprintf("status %d", status)
	c := Classification{Reason: reason}
	if class, ok := r.Status[status]; ok {
		c.Class = class
	} else {
		switch {
		case status == http.StatusUnauthorized, status == http.StatusForbidden:
			c.Class = events.ErrorClassAuth
		case status == http.StatusTooManyRequests:
			c = r.tooManyRequests(header, body)
		case status == http.StatusRequestTimeout, status >= 500 && status < 600:
			c.Class = events.ErrorClassTransient
		case model && status == http.StatusNotFound:
			c.Class, c.Reason = events.ErrorClassConfig, "status 404: no such model or endpoint"
		case model && status == http.StatusBadRequest && r.contextExceeded(body):
			c.Class, c.Reason = events.ErrorClassConfig, "status 400: the prompt exceeds the model's context"
		case status >= 400 && status < 500:
			c.Class = events.ErrorClassDeterministic
		default:
			c.Class = events.ErrorClassModel
		}
	}
	if c.Class == events.ErrorClassTransient {
		c.RetryAfter = r.retryAfter(header)
		if c.RetryAfter > 0 {
			c.Reason += fmt.Sprintf(", retry after %s", c.RetryAfter)
		}
	}
	return c
}

// tooManyRequests reads a 429: a rate-limit body is transient; with a
// Retry-After it is transient unless the body says insufficient_quota; a
// quota body is quota; anything else is transient.
func (r Rules) tooManyRequests(header http.Header, body string) Classification {
	rate, quota := r.RateLimitBody, r.QuotaBody
	if rate == nil {
		rate = DefaultRateLimitBody
	}
	if quota == nil {
		quota = DefaultQuotaBody
	}
	lower := strings.ToLower(body)
	switch {
	case containsAny(lower, rate):
		return Classification{Class: events.ErrorClassTransient, Reason: "status 429: rate limit"}
	case r.retryAfter(header) > 0 && !strings.Contains(lower, "insufficient_quota"):
		// "Quota exceeded … per minute" with a Retry-After: a window that
		// reopens, not an exhausted account.
		return Classification{Class: events.ErrorClassTransient, Reason: "status 429 with Retry-After"}
	case containsAny(lower, quota):
		return Classification{Class: events.ErrorClassQuota, Reason: "status 429: quota exhausted"}
	}
	return Classification{Class: events.ErrorClassTransient, Reason: "status 429"}
}

// contextExceeded reports whether a 400's body says the prompt is longer
// than the model's context.
func (r Rules) contextExceeded(body string) bool {
	markers := r.ContextLengthBody
	if markers == nil {
		markers = DefaultContextLengthBody
	}
	return containsAny(strings.ToLower(body), markers)
}

func containsAny(lower string, subs []string) bool {
	for _, s := range subs {
		if s != "" && strings.Contains(lower, strings.ToLower(s)) {
			return true
		}
	}
	return false
}

// retryAfter reads Retry-After (seconds or an HTTP date) or, failing that,
// retry-after-ms. Zero means none, or a time already past.
func (r Rules) retryAfter(h http.Header) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if secs, err := strconv.ParseFloat(v, 64); err == nil {
			if secs > 0 && secs < 1e9 {
				return time.Duration(secs * float64(time.Second))
			}
			return 0
		}
		if at, err := http.ParseTime(v); err == nil {
			now := time.Now
			if r.Now != nil {
				now = r.Now
			}
			return max(at.Sub(now()), 0)
		}
	}
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	return 0
}
