// Package natsperm names the cause of a call the NATS server refused.
//
// A server refuses a publish or a subscription its permissions do not allow
// with an asynchronous -ERR, and the call itself returns no error: a refused
// JetStream or KV call (each is a request) waits for an answer until its
// deadline and fails with "context deadline exceeded", a refused
// subscription simply never receives. The refusal reaches nats.ErrorHandler
// and becomes the connection's LastError; this package reads it back, so a
// failed start can say which permission is missing instead of "timeout".
package natsperm

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
)

// Error is an operation the server's authorization refused.
type Error struct {
	// User is the connection's NATS user; "" when not known (credentials file).
	User string
	// Op is "publish" or "subscribe".
	Op      string
	Subject string
	// Refusal is the server's answer as the client reported it (it wraps
	// nats.ErrPermissionViolation).
	Refusal error
	// Err is the call that failed because of the refusal, if any (usually a
	// timeout).
	Err error
}

func (e *Error) Error() string {
	user := "this connection's NATS user"
	if e.User != "" {
		user = fmt.Sprintf("NATS user %q", e.User)
	}
	msg := fmt.Sprintf("permission denied for %s: %s may not %s", e.Subject, user, what(e.Op, e.Subject))
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	return msg
}

// Unwrap gives errors.Is both the refusal (nats.ErrPermissionViolation) and
// the failed call.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Refusal}
	}
	return []error{e.Refusal, e.Err}
}

// refusal matches the server's text, e.g.
// `Permissions Violation for Publish to "x"` or
// `Permissions Violation for Subscription to "x" using queue "q"`.
var refusal = regexp.MustCompile(`(?i)permissions violation for (publish|subscription) to "([^"]+)"`)

// Parse reads a refusal the client reported; nil when err is not one.
func Parse(err error) *Error {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	m := refusal.FindStringSubmatch(err.Error())
	if m == nil {
		return nil
	}
	op := "publish"
	if strings.EqualFold(m[1], "subscription") {
		op = "subscribe"
	}
	return &Error{Op: op, Subject: m[2], Refusal: err}
}

// Last returns the connection's latest refusal, nil when its last error is
// not one.
func Last(nc *nats.Conn) *Error {
	e := Parse(nc.LastError())
	if e != nil {
		e.User = nc.Opts.User
	}
	return e
}

// Explain returns err, a call that timed out, as the consequence of the
// connection's latest refusal when there is one; any other err unchanged.
func Explain(nc *nats.Conn, err error) error {
	if err == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
		return err
	}
	e := Last(nc)
	if e == nil {
		return err
	}
	e.Err = err
	return e
}

// what says what a refused subject was for, in the terms of JetStream.
func what(op, subject string) string {
	if op == "subscribe" {
		return "subscribe to it"
	}
	t := strings.Split(subject, ".")
	switch {
	case len(t) >= 3 && t[0] == "$KV":
		return "write to bucket " + t[1]
	case len(t) >= 4 && t[0] == "$JS" && t[1] == "ACK":
		return "acknowledge messages of consumer " + t[3] + " on stream " + t[2]
	case len(t) >= 2 && (t[0] == "$JS" && (t[1] == "API" || t[1] == "FC")):
		for _, tok := range t {
			if b, ok := strings.CutPrefix(tok, "KV_"); ok {
				return "use bucket " + b
			}
		}
		if len(t) >= 6 && t[2] == "CONSUMER" {
			i := 4
			if t[3] == "MSG" || t[3] == "DURABLE" { // MSG.NEXT, DURABLE.CREATE
				i = 5
			}
			if len(t) > i+1 {
				return "use consumer " + t[i+1] + " on stream " + t[i]
			}
		}
		return "use this JetStream API"
	}
	return "publish to it"
}
