package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Subjects of the request-reply API, served by the micro service "dispatch"
// (`nats micro ls`) that runs with intake. Every answer is JSON: the
// endpoint's reply on success, an ErrorReply on failure — whose code and
// message are also in the Nats-Service-Error-Code and Nats-Service-Error
// headers. SubmitAPI is in subjects.go.
const (
	// APIStatus answers a task's state (TaskState). Request: a TaskRequest.
	APIStatus = Root + ".api.status"
	// APIWait answers once the task is terminal, or when the request's
	// timeout passes (a WaitReply). Request: a TaskRequest.
	APIWait = Root + ".api.wait"
	// APIWatch streams the task's stored events to the request's reply
	// subject, in order, one message each, for the request's timeout;
	// then an end message (HeaderWatchEnd). Request: a TaskRequest (After:
	// resume after that sequence). Clients follow a task through it
	// without reading the stream themselves.
	APIWatch = Root + ".api.watch"
)

// Headers of the messages APIWatch sends: each event keeps its own
// Dispatch-Event, Dispatch-Service and Dispatch-Error headers and body, and
// gains these.
const (
	HeaderWatchSubject = "Dispatch-Watch-Subject" // the subject the event is stored on
	HeaderWatchSeq     = "Dispatch-Watch-Seq"     // its stream sequence (decimal): After of the next request
	HeaderWatchTime    = "Dispatch-Watch-Time"    // when it was stored (RFC 3339, nanoseconds)
	// HeaderWatchEnd marks the last message of one watch request: its value
	// says why it ended ("timeout": ask again, with After).
	HeaderWatchEnd = "Dispatch-Watch-End"
)

// Codes of an APIError, borrowed from HTTP.
const (
	// CodeBadRequest: the request is wrong — not JSON, an invalid id or
	// timeout, or (submit) an invalid task. Problems lists what.
	CodeBadRequest = 400
	// CodeNotFound: no task has this id (wait: none appeared before the timeout).
	CodeNotFound = 404
	// CodeConflict: (submit) a task with this id exists and was submitted
	// with another body: Problems names what differs (Submit.Differences).
	// Nothing was queued; send the same body again, or this one under
	// another id.
	CodeConflict = 409
	// CodeRejected: the task submitted with this id was rejected as
	// invalid: Problems says why. It never ran; submit it again, fixed.
	CodeRejected = 422
	// CodeInternal: the service failed; the request may be sent again.
	CodeInternal = 500
	// CodeUnavailable: the service is stopping or has too many waits in
	// progress; send the request again (another instance may answer).
	CodeUnavailable = 503
)

// Wait timeouts (TaskRequest.Timeout).
const (
	DefaultWaitTimeout = 30 * time.Second
	MaxWaitTimeout     = 10 * time.Minute
	// MaxRequestBytes bounds a status or wait request.
	MaxRequestBytes = 4 << 10
)

// APIError is the error of a failed API answer. Schema: api.error.v1.
type APIError struct {
	// Code is one of the Code* constants.
	Code int `json:"code"`
	// Message says what went wrong in one line.
	Message string `json:"message"`
	// Problems lists every problem found (each one a sentence); empty
	// when there is nothing more to say than Message.
	Problems []string `json:"problems"`
}

func (e *APIError) Error() string { return fmt.Sprintf("%d: %s", e.Code, e.Message) }

// NewAPIError returns an error answer; problems may be nil.
func NewAPIError(code int, message string, problems ...string) *APIError {
	if problems == nil {
		problems = []string{}
	}
	return &APIError{Code: code, Message: message, Problems: problems}
}

// ErrorReply is the body of every failed API answer. Schema: api.error.v1.
type ErrorReply struct {
	Error *APIError `json:"error"`
}

// SubmitReply answers a synchronous submit (SubmitAPI). Schema: api.submit.reply.v1.
type SubmitReply struct {
	ID string `json:"id"`
	// Duplicate is true when a task with this id already existed: nothing new
	// was queued.
	Duplicate bool `json:"duplicate,omitempty"`
}

// TaskRequest asks APIStatus or APIWait about one task. Either the bare id
// (the whole body, e.g. `nats req dispatch.api.status fix-42`) or this JSON
// object. Schema: api.request.v1.
type TaskRequest struct {
	ID string `json:"id"`
	// Timeout bounds a wait: a duration such as "90s" or "5m" (units ms,
	// s, m, h). Default 30s, at most 10m. Status ignores it.
	Timeout string `json:"timeout,omitempty"`
	// After is for APIWatch: send the events stored after this stream
	// sequence. Default 0: from the task's first.
	After uint64 `json:"after,omitempty"`
}

// WaitTimeout is the request's timeout, DefaultWaitTimeout when unset. Call
// it on a request DecodeTaskRequest accepted.
func (r TaskRequest) WaitTimeout() time.Duration {
	d, err := time.ParseDuration(r.Timeout)
	if err != nil || d <= 0 {
		return DefaultWaitTimeout
	}
	return d
}

// DecodeTaskRequest reads a status or wait request: a bare task id
// (surrounding white space ignored), a JSON string holding the id, or a
// TaskRequest object (unknown fields rejected). The error is an *APIError
// with CodeBadRequest listing every problem.
func DecodeTaskRequest(data []byte) (TaskRequest, error) {
	var r TaskRequest
	if len(data) > MaxRequestBytes {
		return r, badRequest(fmt.Sprintf("request is %d bytes, limit is %d", len(data), MaxRequestBytes))
	}
	trimmed := bytes.TrimSpace(data)
	switch {
	case len(trimmed) == 0:
		return r, badRequest(`a task id is required: send the id, or {"id": "…"}`)
	case trimmed[0] == '{' || trimmed[0] == '"':
		var err error
		if trimmed[0] == '"' {
			err = decodeOne(trimmed, &r.ID)
		} else {
			err = decodeOne(trimmed, &r)
		}
		if err != nil {
			return TaskRequest{}, badRequest("malformed JSON: " + describeJSONError(err))
		}
	default:
		r.ID = string(trimmed)
	}
	var problems []string
	if !ValidID(r.ID) {
		problems = append(problems, fmt.Sprintf(`"id" %q must be 1-%d characters of A-Z, a-z, 0-9, _ or -`, clipText(r.ID, 80), MaxIDLen))
	}
	if r.Timeout != "" {
		d, err := time.ParseDuration(r.Timeout)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf(`"timeout" %q is not a duration such as "30s" or "5m"`, clipText(r.Timeout, 40)))
		case d <= 0 || d > MaxWaitTimeout:
			problems = append(problems, fmt.Sprintf(`"timeout" %s must be more than 0 and at most %s`, d, MaxWaitTimeout))
		}
	}
	if problems != nil {
		return TaskRequest{}, badRequest(problems...)
	}
	return r, nil
}

func badRequest(problems ...string) *APIError {
	return NewAPIError(CodeBadRequest, "invalid request: "+strings.Join(problems, "; "), problems...)
}

// decodeOne decodes exactly one JSON value into v, unknown fields rejected.
func decodeOne(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing data after the value")
	}
	return nil
}

// clipText shortens s to n bytes for an error message, on a rune boundary.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// WaitReply answers APIWait: the task's outcome once its status is
// terminal, or where it stands when the wait timed out. Schema:
// api.wait.reply.v1.
type WaitReply struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Subject string `json:"subject"`
	// Status is the task's status (Status* constants).
	Status Status `json:"status"`
	// Terminal is true when Status is terminal (see Terminal): the task
	// stays there unless a human acts.
	Terminal bool `json:"terminal"`
	// TimedOut is true when the wait's timeout passed first: Status and
	// Stage say where the task is; ask again to keep waiting.
	TimedOut bool `json:"timed_out,omitempty"`
	// Stage is the task's latest event: a stage (queued, retry, verified,
	// admitted, prompted, executed, succeeded, cancelled) or
	// review.<reason> (gated, escalated, stuck, poison, action). The state
	// is stored before the event that announces it: for a moment a terminal
	// Status may come with the stage before it.
	Stage string `json:"stage,omitempty"`
	// Step and Rung are the pipeline step and the escalation rung of the
	// task's current (or last) attempt.
	Step string `json:"step,omitempty"`
	Rung Rung   `json:"rung,omitempty"`
	// Reason explains a terminal status other than succeeded (and a
	// human's resolve).
	Reason    string `json:"reason,omitempty"`
	LastError string `json:"last_error,omitempty"`
	// Attempts counts the attempts the escalation ladder counted.
	Attempts  int     `json:"attempts"`
	TokensIn  int     `json:"tokens_in"`
	TokensOut int     `json:"tokens_out"`
	Cost      float64 `json:"cost"`
	// Result is the final answer of a succeeded task: the approach, the
	// summary, the changes, the model. Absent when a human resolved it.
	Result    *Result   `json:"result,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// NewWaitReply summarises a task state; the caller adds TimedOut, Stage
// and Result.
func NewWaitReply(st TaskState) WaitReply {
	return WaitReply{
		ID: st.ID, Type: st.Type, Subject: st.Subject, Status: st.Status, Terminal: Terminal(st.Status),
		Step: st.Step, Rung: st.Rung, Reason: st.Reason, LastError: st.LastError, Attempts: st.Attempts,
		TokensIn: st.TokensIn, TokensOut: st.TokensOut, Cost: st.Cost, UpdatedAt: st.UpdatedAt,
	}
}
