// Package client submits tasks to a dispatchmesh and waits for their
// outcome, over a NATS connection — the Go face of the request-reply API
// that any NATS client can use (dispatch.api.submit, dispatch.api.status,
// dispatch.api.wait, dispatch.api.watch; schemas api.*.v1). It needs no
// access to the mesh's streams or stores: the "client" user of deploy/ may
// only publish submissions and API requests and read its own inbox.
//
//	nc, _ := nats.Connect("nats://127.0.0.1:4222")
//	c, _ := client.New(nc)
//	sub, err := c.Submit(ctx, client.Task{Type: "css_fix", Subject: "src/app.css"})
//	out, err := c.Wait(ctx, sub.ID)  // out.Status, out.Result.Summary, out.Attempts, out.Cost
//
// Submit is idempotent for a given id: submitting the same id again makes
// no second task (Submitted.Duplicate). Wait watches: the mesh answers when
// the task's state changes to a terminal one, not on a poll. Watch
// delivers the task's stage events as they are stored. Failed answers are
// *Error values: errors.Is(err, ErrInvalid) for an invalid task, with every
// problem in Error.Problems.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Types of the API, as package events defines them.
type (
	// Task is what Submit sends (schema submit.v1).
	Task = events.Submit
	// Submitted is Submit's answer: the task id, and whether it existed already.
	Submitted = events.SubmitReply
	// State is a task's whole current state (schema task_state.v1).
	State = events.TaskState
	// Outcome is Wait's answer: status, final answer, attempts, cost
	// (schema api.wait.reply.v1).
	Outcome = events.WaitReply
	// Result is the final answer of a succeeded task.
	Result = events.Result
)

// DefaultRequestTimeout bounds Submit and Status when ctx has no deadline:
// while no service answers they ask again until then.
const DefaultRequestTimeout = 10 * time.Second

// Client talks to the mesh on one NATS connection. It is safe for
// concurrent use.
type Client struct {
	nc             *nats.Conn
	requestTimeout time.Duration
}

// Option configures a Client.
type Option func(*Client) error

// ErrInvalidOption wraps every error of an Option.
var ErrInvalidOption = errors.New("client: invalid option")

// WithRequestTimeout bounds Submit and Status when their ctx has no
// deadline. Default DefaultRequestTimeout.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *Client) error {
		if d <= 0 {
			return fmt.Errorf("%w: request timeout %s must be positive", ErrInvalidOption, d)
		}
		c.requestTimeout = d
		return nil
	}
}

// New returns a client on nc. Closing nc is the caller's.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	c := &Client{nc: nc, requestTimeout: DefaultRequestTimeout}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	if err := checkInbox(nc); err != nil {
		return nil, err
	}
	return c, nil
}

// ErrInboxRefused: the server refuses the connection's subscriptions to
// its inboxes, where every answer comes; nothing would ever be answered.
var ErrInboxRefused = errors.New("client: the NATS server refuses this connection's inbox")

// checkInbox subscribes to one of nc's inboxes and reports
// ErrInboxRefused when the server refuses it. A refusal comes back
// asynchronously, before the answer to the flush that follows: without
// this check a request would wait out its whole timeout.
func checkInbox(nc *nats.Conn) error {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("client: subscribe to %s: %w", inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.FlushTimeout(DefaultRequestTimeout); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if last := nc.LastError(); last != nil && strings.Contains(last.Error(), inbox) {
		return fmt.Errorf("%w (%v): connect with the inbox prefix your NATS user may read, "+
			"nats.CustomInboxPrefix(\"_INBOX.<user>\") (the client user of deploy/: _INBOX.client)", ErrInboxRefused, last)
	}
	return nil
}

// Submit validates t and submits it through the mesh's submit API. Without
// an id, one is generated here. When the request fails after the task was
// sent (a timeout, a lost answer), the returned Submitted still carries the
// id it was sent with: submitting again with that id (Task.ID) makes no
// second task (Submitted.Duplicate says it existed). An invalid task is an
// *Error with code 400 listing every problem (errors.Is(err, ErrInvalid)),
// found before anything is sent.
func (c *Client) Submit(ctx context.Context, t Task) (Submitted, error) {
	if t.ID == "" {
		t.ID = nuid.Next()
	}
	body, err := json.Marshal(t)
	if err != nil { // a Payload that is not JSON
		return Submitted{}, &Error{Code: events.CodeBadRequest, Message: "invalid task: " + err.Error(),
			Problems: []string{`"payload" is not valid JSON`}}
	}
	if _, err := events.DecodeSubmit(body, ""); err != nil {
		var inv *events.InvalidError
		if errors.As(err, &inv) {
			return Submitted{}, &Error{Code: events.CodeBadRequest, Message: err.Error(), Problems: inv.Problems}
		}
		return Submitted{}, err
	}
	var s Submitted
	if err := c.request(ctx, events.SubmitAPI, body, &s); err != nil {
		return Submitted{ID: t.ID}, err
	}
	return s, nil
}

// Status returns the task's current state. An id without a task is an
// *Error: ErrRejected (its submission was invalid: Problems says why) or
// ErrNotFound.
func (c *Client) Status(ctx context.Context, id string) (State, error) {
	var st State
	body, err := taskRequest(id, 0)
	if err != nil {
		return st, err
	}
	return st, c.request(ctx, events.APIStatus, body, &st)
}

func taskRequest(id string, timeout time.Duration) ([]byte, error) {
	r := events.TaskRequest{ID: id}
	if timeout > 0 {
		r.Timeout = timeout.String()
	}
	body, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if _, err := events.DecodeTaskRequest(body); err != nil {
		return nil, asError(err)
	}
	return body, nil
}

// request sends body to subject and decodes the answer into v, or returns
// the *Error it carries. While no service answers (the mesh is starting or
// an instance restarting) it asks again until ctx ends.
func (c *Client) request(ctx context.Context, subject string, body []byte, v any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.requestTimeout)
		defer cancel()
	}
	var msg *nats.Msg
	var err error
	unanswered := false // some request found no service
	for retry := 50 * time.Millisecond; ; retry = min(2*retry, time.Second) {
		if h := traceHeader(ctx); h != nil {
			msg, err = c.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subject, Data: body, Header: h})
		} else {
			msg, err = c.nc.RequestWithContext(ctx, subject, body)
		}
		unanswered = unanswered || errors.Is(err, nats.ErrNoResponders)
		if !errors.Is(err, nats.ErrNoResponders) || !sleep(ctx, retry) {
			break
		}
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders), unanswered && ctx.Err() != nil:
		// No service answered until ctx ended: the last request may have
		// run out of time rather than found none, it is the same answer.
		return &Error{Code: events.CodeUnavailable, Problems: []string{},
			Message: fmt.Sprintf("no dispatch service answers on %s: is the mesh up (dispatch up)?", subject)}
	case err != nil:
		return fmt.Errorf("%s: %w", subject, err)
	}
	if e := answerError(msg); e != nil {
		return e
	}
	if err := json.Unmarshal(msg.Data, v); err != nil {
		return fmt.Errorf("%s: answer %q: %w", subject, clip(msg.Data), err)
	}
	return nil
}

// traceHeader is the W3C traceparent (and tracestate) of ctx's span
// context, when ctx has one (an OpenTelemetry span the caller started):
// the mesh continues that trace. Else nil.
func traceHeader(ctx context.Context) nats.Header {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	h := nats.Header{}
	propagation.TraceContext{}.Inject(ctx, traceCarrier(h))
	return h
}

// traceCarrier writes a trace context into NATS headers under the
// lowercase names W3C gives (NATS header names are case-sensitive).
type traceCarrier nats.Header

func (h traceCarrier) Get(key string) string { return nats.Header(h).Get(key) }
func (h traceCarrier) Set(key, value string) { h[key] = []string{value} }
func (h traceCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// answerError is the *Error a failed answer carries: the JSON body's, or
// the micro headers' when the body has none.
func answerError(msg *nats.Msg) *Error {
	var r struct {
		Error *Error `json:"error"`
	}
	if json.Unmarshal(msg.Data, &r) == nil && r.Error != nil {
		if r.Error.Problems == nil {
			r.Error.Problems = []string{}
		}
		return r.Error
	}
	code, desc := msg.Header.Get(micro.ErrorCodeHeader), msg.Header.Get(micro.ErrorHeader)
	if code == "" && desc == "" {
		return nil
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		n = events.CodeInternal
	}
	return &Error{Code: n, Message: desc, Problems: []string{}}
}

// clip is the start of b for an error message: at most 200 bytes, cut on
// a rune boundary and marked. (Not textcut's Clip: the client imports
// only events and nats.go.)
func clip(b []byte) string {
	s, n := string(b), 200
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
