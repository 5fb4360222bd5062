package client

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// stream is the stream holding every task event (services.Stream).
const stream = "DISPATCH"

// Event is one stored event of a task: a stage or a review record.
type Event struct {
	// Seq is the event's sequence in the stream; Time when it was stored.
	Seq  uint64
	Time time.Time
	// Stage is the stage (queued, retry, verified, admitted, prompted,
	// executed, succeeded, cancelled) or review.<reason> (rejected, gated,
	// escalated, stuck, poison, action).
	Stage string
	// Name is the versioned event name, e.g. task.executed.v1: its schema.
	Name string
	// By is the service instance that published it.
	By string
	// Error is the error a review record carries.
	Error string
	// Data is the event as stored: JSON of the schema Name (a rejected
	// or poison record keeps the original bytes instead).
	Data []byte
}

// Decode decodes the event into v, e.g. an events.Executed for stage
// executed.
func (e Event) Decode(v any) error { return json.Unmarshal(e.Data, v) }

// Final reports whether the event ends the task (until a human acts), and
// whether it ended well. A human's review.action ends it when it cancels
// the task (a cancel publishes no other event); a requeue sends it on.
func (e Event) Final() (final, ok bool) {
	switch e.Stage {
	case events.StageSucceeded:
		return true, true
	case events.StageCancelled:
		return true, false
	case "review." + events.ReviewAction:
		var a events.Action
		return e.Decode(&a) == nil && a.Action == events.ActionCancel, false
	}
	return strings.HasPrefix(e.Stage, "review."), false
}

// Watch calls fn with each of the task's events in order, from its first,
// as they are stored, until fn returns false (Watch returns nil) or ctx
// ends (it returns ctx.Err()). It reads the task's events through an
// ordered consumer on the stream, which the NATS user must be allowed to
// create (the "client" user of deploy/ may).
func (c *Client) Watch(ctx context.Context, id string, fn func(Event) bool) error {
	if !events.ValidID(id) {
		return &Error{Code: events.CodeBadRequest, Message: fmt.Sprintf("invalid task id %q", id),
			Problems: []string{fmt.Sprintf(`"id" %q must be 1-%d characters of A-Z, a-z, 0-9, _ or -`, id, events.MaxIDLen)}}
	}
	cons, err := c.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{events.TaskFilter(id), events.ReviewTaskFilter(id)},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("watch task %s: %w", id, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("watch task %s: %w", id, err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return fmt.Errorf("watch task %s: %w", id, err)
		}
		if !fn(eventOf(msg)) {
			return nil
		}
	}
}

func eventOf(msg jetstream.Msg) Event {
	h := msg.Headers()
	e := Event{Name: h.Get(events.HeaderEvent), By: h.Get(events.HeaderService), Error: h.Get(events.HeaderError), Data: msg.Data()}
	if md, err := msg.Metadata(); err == nil {
		e.Seq, e.Time = md.Sequence.Stream, md.Timestamp
	}
	if _, stage, ok := events.ParseTaskSubject(msg.Subject()); ok {
		e.Stage = stage
	} else if reason, _, ok := events.ParseReviewSubject(msg.Subject()); ok {
		e.Stage = "review." + reason
	}
	return e
}
