package review

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

// Record is one message on a review subject, as stored.
type Record struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Reason is the review reason (rejected, gated, escalated, poison,
	// stuck), or "action" for a human decision.
	Reason string `json:"reason"`
	// Key is the last subject token: the task id, or seq-N / api-<hash> for
	// input that never became a task.
	Key   string `json:"key"`
	Event string `json:"event,omitempty"`
	// By is the Dispatch-Service header: who wrote the record.
	By string `json:"by,omitempty"`
	// Error is the Dispatch-Error header: why it is here.
	Error string `json:"error,omitempty"`
	// OrigSubject is where a dead-lettered message was first published.
	OrigSubject string `json:"orig_subject,omitempty"`
	Subject     string `json:"subject"`
	// Type, TaskSubject and Pass are read from the body when it carries a task.
	Type        string `json:"type,omitempty"`
	TaskSubject string `json:"task_subject,omitempty"`
	Pass        int    `json:"pass,omitempty"`
	// Action is the decoded decision of an "action" record.
	Action *events.Action `json:"action,omitempty"`
	// Body is the message body when it is JSON; Raw holds (a clip of) any
	// other body, such as the original bytes of rejected input.
	Body json.RawMessage `json:"body,omitempty"`
	Raw  string          `json:"raw,omitempty"`
}

// ReasonAction is the review subject token of human decisions.
const ReasonAction = events.ReviewAction

// maxRaw bounds the non-JSON body kept on a Record.
const maxRaw = 4096

// record decodes one stored review message.
func record(msg jetstream.Msg) Record {
	r := decodeRecord(msg.Subject(), msg.Headers(), msg.Data())
	if md, err := msg.Metadata(); err == nil {
		r.Seq, r.Time = md.Sequence.Stream, md.Timestamp
	}
	return r
}

// decodeRecord reads a review message. Its body is outside input (a
// rejected submission's original bytes, any client's message): anything
// decodes, what does not parse is kept as Raw.
func decodeRecord(subject string, h nats.Header, data []byte) Record {
	r := decodeBody(subject, h, data)
	// The pass in the header holds even when the body does not decode.
	if n, err := strconv.Atoi(h.Get(events.HeaderPass)); err == nil && n > 0 {
		r.Pass = n
	}
	return r
}

func decodeBody(subject string, h nats.Header, data []byte) Record {
	r := Record{
		Subject: subject, Event: h.Get(events.HeaderEvent), By: h.Get(events.HeaderService),
		Error: h.Get(events.HeaderError), OrigSubject: h.Get(events.HeaderOrigSubj),
	}
	r.Reason, r.Key, _ = events.ParseReviewSubject(r.Subject)
	if !json.Valid(data) {
		r.Raw = textcut.Clip(string(data), maxRaw)
		return r
	}
	r.Body = data
	if r.Reason == ReasonAction {
		var a events.Action
		if json.Unmarshal(data, &a) == nil {
			r.Action = &a
		}
		return r
	}
	var body struct {
		Task    events.Task `json:"task"`
		Run     events.Run  `json:"run"`
		Type    string      `json:"type"`    // a rejected submission's own fields
		Subject string      `json:"subject"` // (the body is the submission)
	}
	if json.Unmarshal(data, &body) == nil {
		r.Type, r.TaskSubject, r.Pass = body.Task.Type, body.Task.Subject, body.Run.Pass
		if r.Type == "" {
			r.Type, r.TaskSubject = body.Type, body.Subject
		}
		if r.Type == "" { // a rejected submission takes its type from the subject
			r.Type, _ = strings.CutPrefix(r.OrigSubject, events.SubmitRoot+".")
		}
	}
	return r
}

// read delivers every message stored now on the filters, in stream order.
func read(ctx context.Context, js jetstream.JetStream, stream string, filters []string, fn func(jetstream.Msg)) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		// Readers come and go (every page, every command): let the server
		// drop a forgotten consumer soon instead of after 5 minutes.
		InactiveThreshold: 10 * time.Second,
		FilterSubjects:    filters, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("read %v: %w", filters, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("read %v: %w", filters, err)
	}
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read %v: %w", filters, err)
		}
		n := uint64(0)
		for msg := range batch.Messages() {
			n++
			fn(msg)
		}
		if err := batch.Error(); err != nil && n == 0 {
			return fmt.Errorf("read %v: %w", filters, err)
		}
		if n == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("read %v: %d messages announced but none delivered", filters, pending)
		}
		pending -= min(n, pending)
	}
	return nil
}

// records returns every review record on the filters.
func (c *Client) records(ctx context.Context, filters ...string) ([]Record, error) {
	var out []Record
	err := read(ctx, c.cfg.JS, c.cfg.Stream, filters, func(m jetstream.Msg) { out = append(out, record(m)) })
	return out, err
}
