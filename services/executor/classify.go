package executor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	openai "github.com/sashabaranov/go-openai"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
)

// Default body markers of a 429 answer, of a 400 saying the prompt is
// longer than the model's context, and of a 400 saying the endpoint does
// not support the request's shape (Rules). A quota marker says the
// account's quota is spent — "quota" alone does not: "Quota exceeded for
// requests per minute" is a window that reopens.
var (
	DefaultRateLimitBody     = []string{"rate_limit_exceeded", "rate limit"}
	DefaultQuotaBody         = []string{"insufficient_quota", "exceeded your current quota", "quota exhausted", "quota has been exhausted", "quota used up", "daily quota", "monthly quota", "billing"}
	DefaultContextLengthBody = []string{"context_length_exceeded", "maximum context length"}
	DefaultRequestShapeBody  = []string{"unsupported_parameter", "unsupported_value", "unknown_parameter", "unrecognized request argument", "not supported", "does not support", "tool choice requires"}
)

// Rules tune Classify. The zero value is the built-in mapping.
type Rules struct {
	// Status gives the class of a status code (an HTTP status, a tool's
	// Nats-Service-Error-Code), overriding the built-in mapping: 401 and 403
	// auth; 408 and 5xx transient; 429 read from its body and headers; a
	// model's 404 (no such model or endpoint) config, and its 400 config
	// when the body says the context is exceeded (ContextLengthBody) or the
	// request's shape is not supported (RequestShapeBody, 422 too); other
	// 4xx deterministic. Default: no overrides.
	Status map[int]events.ErrorClass
	// RateLimitBody are substrings (case-insensitive) of a 429 answer that
	// make it a transient rate limit; they are looked for before QuotaBody.
	// Default DefaultRateLimitBody.
	RateLimitBody []string
	// QuotaBody are substrings (case-insensitive) of a 429 answer saying the
	// quota is exhausted: ErrorClassQuota. Default DefaultQuotaBody. A 429
	// matching neither is transient, and so is one with a Retry-After
	// unless its body says insufficient_quota. The body markers given here
	// replace the defaults (dispatch adds DISPATCH_*_BODY to them).
	QuotaBody []string
	// ContextLengthBody are substrings (case-insensitive) of a model's 400
	// answer saying the prompt exceeds the model's context: ErrorClassConfig.
	// Default DefaultContextLengthBody.
	ContextLengthBody []string
	// Now is the clock a Retry-After HTTP date is read against. Default time.Now.
	Now func() time.Time
	// MaxRetryAfter caps the delay a Retry-After (or retry-after-ms) asks
	// for: a task waits at most this long for the provider before trying
	// again (a later answer asks again). Default DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// RequestShapeBody are substrings (case-insensitive) of a model's 400 or
	// 422 answer saying the endpoint does not support something every
	// request of the type carries — a parameter, the JSON response format,
	// tools: ErrorClassConfig. Default DefaultRequestShapeBody.
	RequestShapeBody []string
}

// DefaultMaxRetryAfter is the longest Retry-After a task waits (Rules).
const DefaultMaxRetryAfter = 15 * time.Minute

// Exit statuses with which a shell says the command it was asked to run
// cannot be run: not executable (126), not found (127).
const (
	ExitCannotExecute = 126
	ExitNotFound      = 127
)

// Classification is what Classify found.
type Classification struct {
	// Class is an events.ErrorClass*: transient, deterministic, auth, quota,
	// config (the model or endpoint does not exist or cannot be called, the
	// prompt exceeds the context, the endpoint rejects the request's shape,
	// an agent command cannot start), timeout (an agent command timed out),
	// or model when nothing is known.
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
	if c, ok := unusableEndpoint(err); ok {
		return c
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
	case e.ExitCode == ExitCannotExecute:
		return Classification{Class: events.ErrorClassConfig, Reason: "command exited with status 126: the shell cannot execute it"}
	case e.ExitCode == ExitNotFound:
		return Classification{Class: events.ErrorClassConfig, Reason: "command exited with status 127: the shell cannot find it"}
	case e.ExitCode >= 0:
		return Classification{Class: events.ErrorClassDeterministic, Reason: fmt.Sprintf("command exited with status %d", e.ExitCode)}
	case e.CPULimit > 0 || errors.Is(e.Err, procgroup.ErrCPULimit):
		return Classification{Class: events.ErrorClassDeterministic, Reason: "command used up its CPU time limit"}
	case e.Killed:
		return Classification{Class: events.ErrorClassDeterministic, Reason: "command was killed by a signal"}
	}
	// It never ran: not installed, not executable, not configured. The
	// deployment's to fix; no retry of the task can.
	return Classification{Class: events.ErrorClassConfig, Reason: "command could not start"}
}

// unusableEndpoint recognises a call that failed because the endpoint, as
// configured, cannot be called at all — a URL that is not http(s) or has
// no host, a certificate the executor does not trust, HTTPS spoken to an
// HTTP server: every call fails alike until the deployment changes.
func unusableEndpoint(err error) (Classification, bool) {
	config := func(reason string) (Classification, bool) {
		return Classification{Class: events.ErrorClassConfig, Reason: reason}, true
	}
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		roots    x509.SystemRootsError
	)
	switch {
	case errors.Is(err, http.ErrSchemeMismatch):
		return config("the endpoint answers HTTP, not HTTPS")
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostname),
		errors.As(err, &invalid), errors.As(err, &roots):
		return config("the endpoint's TLS certificate is not trusted")
	}
	if u, bad := badURL(err); bad {
		return config(fmt.Sprintf("the endpoint URL %q cannot be called", u))
	}
	return Classification{}, false
}

// badURL reports the URL of a request that could not be sent because of
// its URL: one that does not parse, or is not http(s) with a host.
func badURL(err error) (string, bool) {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return "", false
	}
	if ue.Op == "parse" {
		return ue.URL, true
	}
	u, perr := url.Parse(ue.URL)
	if perr != nil {
		return ue.URL, true
	}
	return ue.URL, (u.Scheme != "http" && u.Scheme != "https") || u.Host == ""
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
		case model && (status == http.StatusBadRequest || status == http.StatusUnprocessableEntity) && r.shapeRejected(body):
			c.Class, c.Reason = events.ErrorClassConfig, reason+": the endpoint does not support the request's shape"
		case status >= 400 && status < 500:
			c.Class = events.ErrorClassDeterministic
		default:
			c.Class = events.ErrorClassModel
		}
	}
	if c.Class == events.ErrorClassTransient {
		asked := r.retryAfter(header)
		c.RetryAfter = min(asked, r.maxRetryAfter())
		switch {
		case asked > c.RetryAfter:
			c.Reason += fmt.Sprintf(", retry after %s (asked %s)", c.RetryAfter, asked)
		case c.RetryAfter > 0:
			c.Reason += fmt.Sprintf(", retry after %s", c.RetryAfter)
		}
	}
	return c
}

func (r Rules) maxRetryAfter() time.Duration {
	if r.MaxRetryAfter > 0 {
		return r.MaxRetryAfter
	}
	return DefaultMaxRetryAfter
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

// shapeRejected reports whether a 400's body says the endpoint does not
// support the request's shape.
func (r Rules) shapeRejected(body string) bool {
	markers := r.RequestShapeBody
	if markers == nil {
		markers = DefaultRequestShapeBody
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
