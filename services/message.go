package services

import (
	"fmt"
	"strconv"
	"time"

	json "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Msg is what a handler sees of a consumed message.
type Msg struct {
	Subject string
	Header  nats.Header
	Data    []byte
	// Seq is the message's stream sequence.
	Seq uint64
	// Delivered counts deliveries of this message, 1 on the first.
	Delivered int
	// Time is when the stream stored the message.
	Time time.Time
	// InProgress tells the server the message is still being worked on,
	// pushing its redelivery back by AckWait. The router sets it for the
	// Heartbeat middleware; handlers leave it alone. Nil for a message
	// that is not a delivery.
	InProgress func() error
}

// Out is a message a handler wants published.
type Out struct {
	Subject string
	// MsgID is the Nats-Msg-Id: deterministic, so a redelivered input
	// republishes the same id and the stream keeps one copy.
	MsgID  string
	Header nats.Header
	Data   []byte
	// WithLast publishes an output before the last together with the last
	// one, instead of storing it first: for what nothing the last output
	// wakes reads (the task index). The input is acked once all are
	// stored either way.
	WithLast bool
}

// NatsMsg is out as a NATS message: subject, header and data (publish it
// with jetstream.WithMsgID(out.MsgID)).
func NatsMsg(out Out) *nats.Msg {
	h := out.Header
	if h == nil {
		h = nats.Header{}
	}
	return &nats.Msg{Subject: out.Subject, Header: h, Data: out.Data}
}

// OutMsg is m as an output: its Nats-Msg-Id header becomes the Out's MsgID.
// m is not modified.
func OutMsg(m *nats.Msg) Out {
	h := nats.Header{}
	for k, v := range m.Header {
		if k != nats.MsgIdHdr {
			h[k] = v
		}
	}
	return Out{Subject: m.Subject, MsgID: m.Header.Get(nats.MsgIdHdr), Header: h, Data: m.Data}
}

// MsgID is the deterministic id of a task's event for one pass (events.MsgID).
func MsgID(taskID string, pass int, stage string) string { return events.MsgID(taskID, pass, stage) }

// Emit builds an output carrying event v (JSON) under the given name.
func Emit(subject, msgID, name, taskID string, v any) (Out, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return Out{}, fmt.Errorf("encode %s: %w", name, err)
	}
	h := nats.Header{}
	h.Set(events.HeaderEvent, name)
	if taskID != "" {
		h.Set(events.HeaderTaskID, taskID)
	}
	return Out{Subject: subject, MsgID: msgID, Header: h, Data: data}, nil
}

// Next builds the event of the next stage of the task in b. Its headers
// name the task and the pass, so whoever cannot decode the body (a
// dead-letter, a reviewer) still knows where it belongs.
func Next(b events.Base, stage, name string, v any) (Out, error) {
	return NextAs(b, stage, stage, name, v)
}

// NextAs is Next with the Nats-Msg-Id of key instead of the stage: for a
// stage a pass may reach more than once, each time for another reason.
func NextAs(b events.Base, stage, key, name string, v any) (Out, error) {
	out, err := Emit(events.TaskSubject(b.Task.ID, stage), MsgID(b.Task.ID, b.Run.Pass, key), name, b.Task.ID, v)
	if err == nil {
		out.Header.Set(events.HeaderPass, strconv.Itoa(b.Run.Pass))
	}
	return out, err
}

// FromClient reports whether subject is one clients publish on (a
// submission): its message's headers are theirs, never the mesh's.
func FromClient(subject string) bool {
	_, ok := events.ParseSubmitSubject(subject)
	return ok || subject == events.SubmitRoot
}

// ToReview builds a review record for the task in b.
func ToReview(b events.Base, reason, name, text string, v any) (Out, error) {
	out, err := Emit(events.ReviewSubject(reason, b.Task.ID), MsgID(b.Task.ID, b.Run.Pass, reason), name, b.Task.ID, v)
	if err == nil {
		out.Header.Set(events.HeaderPass, strconv.Itoa(b.Run.Pass))
		out.Header.Set(events.HeaderReason, reason)
		out.Header.Set(events.HeaderError, text)
	}
	return out, err
}

// TaskOf reads which task, and which pass of it, a message belongs to
// without relying on its body: the Dispatch-Task-Id and Dispatch-Pass
// headers, else the subject (dispatch.task.<id>.<stage>) and what of the
// body decodes. A submission belongs to the task it makes: its id, or the
// one intake generates, on pass 1 — unless it is invalid (no task); its
// headers are the client's and are never read. id is "" and pass 0 when
// they cannot be read.
func TaskOf(m *Msg) (id string, pass int) {
	if FromClient(m.Subject) {
		if sub, err := events.DecodeSubmitFrom(m.Subject, m.Data); err == nil {
			return sub.Task(events.GeneratedID(m.Seq, m.Time), m.Time).ID, 1
		}
		return "", 0
	}
	id = m.Header.Get(events.HeaderTaskID)
	if id == "" {
		id, _, _ = events.ParseTaskSubject(m.Subject)
	}
	if n, err := strconv.Atoi(m.Header.Get(events.HeaderPass)); err == nil && n > 0 {
		pass = n
	} else {
		var v struct {
			Run struct {
				Pass int `json:"pass"`
			} `json:"run"`
		}
		if json.Unmarshal(m.Data, &v) == nil && v.Run.Pass > 0 {
			pass = v.Run.Pass
		}
	}
	if !events.ValidID(id) {
		return "", 0
	}
	return id, pass
}

// Decode unmarshals a message body into v. Its error is permanent: the same
// bytes will never decode, so the message goes to review as poison. It
// decodes as encoding/json does, with the json/v2 implementation (the v1
// API of github.com/go-json-experiment/json), whose error types are its
// own: match the error as Dead, never as an encoding/json type.
func Decode(m *Msg, v any) error {
	if err := json.Unmarshal(m.Data, v); err != nil {
		return Dead(events.ReviewPoison, fmt.Errorf("undecodable %s: %w", m.Subject, err))
	}
	return nil
}
