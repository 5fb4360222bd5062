package verifier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// NATS asks a request-reply endpoint, so a verifier can be written in any
// language. The request is the task JSON (with the Dispatch-Task-Id header);
// the reply is {"exists": bool, "detail": "..."}. A reply carrying a micro
// service error header, a reply that is not that JSON, no responders and a
// timeout are all errors.
type NATS struct {
	NC      *nats.Conn
	Subject string
	// Timeout bounds the request. Default DefaultTimeout.
	Timeout time.Duration
}

// ServiceError is a verifier's error reply (the Nats-Service-Error and
// Nats-Service-Error-Code headers a micro service's req.Error sets).
type ServiceError struct {
	Code        string
	Description string
}

func (e *ServiceError) Error() string {
	return fmt.Sprintf("verifier replied with error %s: %s", e.Code, e.Description)
}

// Check sends the task and reads the verdict from the reply.
func (c *NATS) Check(ctx context.Context, t events.Task) (events.Verification, error) {
	v := events.Verification{Verifier: policy.VerifierNATS}
	if c.NC == nil {
		return v, ErrNoConn
	}
	data, err := json.Marshal(t)
	if err != nil {
		return v, fmt.Errorf("encode task: %w", err)
	}
	d := timeout(c.Timeout)
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	req := nats.NewMsg(c.Subject)
	req.Header.Set(events.HeaderTaskID, t.ID)
	req.Data = data
	reply, err := c.NC.RequestMsgWithContext(cctx, req)
	if err != nil {
		if errors.Is(err, nats.ErrTimeout) {
			err = context.DeadlineExceeded
		}
		return v, fmt.Errorf("nats verifier %s: %w", c.Subject, checkErr(ctx, cctx, d, err))
	}
	if desc, code := reply.Header.Get(micro.ErrorHeader), reply.Header.Get(micro.ErrorCodeHeader); desc != "" || code != "" {
		return v, fmt.Errorf("nats verifier %s: %w", c.Subject, &ServiceError{Code: code, Description: desc})
	}
	exists, detail, err := decodeReply(reply.Data)
	if err != nil {
		return v, fmt.Errorf("nats verifier %s: %w", c.Subject, err)
	}
	v.Verdict, v.Detail = events.VerdictStale, detail
	if exists {
		v.Verdict = events.VerdictExists
	}
	return v, nil
}

// reply is a NATS verifier's answer. Exists is a pointer so a reply without
// it is an error rather than a silent "stale".
type reply struct {
	Exists *bool  `json:"exists"`
	Detail string `json:"detail"`
}

// decodeReply parses {"exists": bool, "detail": "..."}: one JSON object with
// a boolean exists; other fields are ignored, detail is optional and clipped
// to MaxDetail. Anything else wraps ErrBadReply.
func decodeReply(data []byte) (exists bool, detail string, err error) {
	var r reply
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		return false, "", fmt.Errorf("%w: %v (reply %q)", ErrBadReply, err, clip(string(data)))
	}
	if len(bytes.TrimSpace(data[dec.InputOffset():])) > 0 {
		return false, "", fmt.Errorf("%w: trailing data after the object", ErrBadReply)
	}
	if r.Exists == nil {
		return false, "", fmt.Errorf(`%w: "exists" (a boolean) is required (reply %q)`, ErrBadReply, clip(string(data)))
	}
	return *r.Exists, clip(r.Detail), nil
}
