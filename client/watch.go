package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
)

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
// ends (it returns ctx.Err()). It asks the mesh's watch API
// (dispatch.api.watch), which streams the events to this connection's
// inbox: the NATS user needs no access to the stream.
func (c *Client) Watch(ctx context.Context, id string, fn func(Event) bool) error {
	if !events.ValidID(id) {
		return &Error{Code: events.CodeBadRequest, Message: fmt.Sprintf("invalid task id %q", id),
			Problems: []string{fmt.Sprintf(`"id" %q must be 1-%d characters of A-Z, a-z, 0-9, _ or -`, id, events.MaxIDLen)}}
	}
	var after uint64
	for retry := 50 * time.Millisecond; ; {
		more, err := c.watchOnce(ctx, id, &after, fn)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, errNoWatcher), errors.Is(err, errBusy):
			// No instance answers (yet), or it is busy or stopping: the
			// mesh is starting, restarting or full; ask again, later.
			if !sleep(ctx, retry) {
				return ctx.Err()
			}
			retry = min(2*retry, time.Second)
			continue
		case err != nil:
			return err
		case !more:
			return nil
		}
		retry = 50 * time.Millisecond
	}
}

// watchSpan is how long one watch request streams before it is asked
// again from the last event received.
const watchSpan = 30 * time.Second

// errNoWatcher: no instance answered a watch request; errBusy: one
// answered that it is stopping or holds as many waits as it may.
var (
	errNoWatcher = errors.New("no dispatch service answers " + events.APIWatch)
	errBusy      = errors.New("the dispatch service is busy or stopping")
)

// watchOnce sends one watch request and delivers its events to fn,
// advancing *after. more is false when fn asked to stop.
func (c *Client) watchOnce(ctx context.Context, id string, after *uint64, fn func(Event) bool) (more bool, err error) {
	body, err := json.Marshal(events.TaskRequest{ID: id, Timeout: watchSpan.String(), After: *after})
	if err != nil {
		return false, err
	}
	inbox := c.nc.NewInbox() // under the connection's inbox prefix
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		return false, fmt.Errorf("watch task %s: %w", id, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.nc.PublishRequest(events.APIWatch, inbox, body); err != nil {
		return false, fmt.Errorf("watch task %s: %w", id, err)
	}
	for {
		// An instance that stops answering (killed) is asked again once the
		// span it promised is over.
		mctx, cancel := context.WithTimeout(ctx, watchSpan+10*time.Second)
		msg, err := sub.NextMsgWithContext(mctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return false, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			return true, nil
		case err != nil:
			return false, fmt.Errorf("watch task %s: %w", id, err)
		}
		if msg.Header.Get("Status") == "503" && len(msg.Data) == 0 {
			return false, errNoWatcher
		}
		if msg.Header.Get(events.HeaderWatchEnd) != "" {
			return true, nil
		}
		if e := answerError(msg); e != nil {
			if e.Code == events.CodeUnavailable {
				return false, errBusy // ask again after a pause
			}
			return false, e
		}
		ev := eventOf(msg)
		if ev.Seq <= *after {
			continue
		}
		*after = ev.Seq
		if !fn(ev) {
			return false, nil
		}
	}
}

// eventOf is the Event a watch message carries.
func eventOf(msg *nats.Msg) Event {
	h := msg.Header
	e := Event{Name: h.Get(events.HeaderEvent), By: h.Get(events.HeaderService), Error: h.Get(events.HeaderError), Data: msg.Data}
	e.Seq, _ = strconv.ParseUint(h.Get(events.HeaderWatchSeq), 10, 64)
	e.Time, _ = time.Parse(time.RFC3339Nano, h.Get(events.HeaderWatchTime))
	subject := h.Get(events.HeaderWatchSubject)
	if _, stage, ok := events.ParseTaskSubject(subject); ok {
		e.Stage = stage
	} else if reason, _, ok := events.ParseReviewSubject(subject); ok {
		e.Stage = "review." + reason
	}
	return e
}
