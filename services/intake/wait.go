package intake

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// lookupTimeout bounds the reads that complete a wait's answer.
const lookupTimeout = 5 * time.Second

// wait answers dispatch.api.wait, held (hold).
func (a *API) wait(ctx context.Context, r *request, tr events.TaskRequest) {
	reply, err := a.Wait(ctx, tr.ID, tr.WaitTimeout())
	a.answer(r, reply, err)
}

// Wait watches the task's state — a KV watch of its key, no polling —
// until its status is settled — terminal, or held by the gate for its
// type's trust (events.Settled: nothing happens to it until the type
// recovers) — then answers its outcome (with the final answer of a
// succeeded task; a held one says so: status held, terminal false). When timeout passes first the answer has
// TimedOut set and says where the task is (status and stage). An id
// without a task is answered with its rejection (events.CodeRejected) as
// soon as one is kept, else with events.CodeNotFound at the timeout. When
// ctx ends first (the service stops) the error is events.CodeUnavailable.
func (a *API) Wait(ctx context.Context, id string, timeout time.Duration) (events.WaitReply, error) {
	// Subscribed before anything is read: a rejection is either stored
	// before the read below or delivered here.
	rejected := make(chan *nats.Msg, 4)
	sub, err := a.JS.Conn().ChanSubscribe(events.ReviewSubject(events.ReviewRejected, id), rejected)
	if err != nil {
		return events.WaitReply{}, fmt.Errorf("watch rejections of %s: %w", id, err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	w, err := a.Tasks.Follow(wctx, a.JS, id)
	if err != nil {
		return events.WaitReply{}, fmt.Errorf("watch task %s: %w", id, err)
	}
	defer func() { _ = w.Stop() }()

	var st events.TaskState
	found := false
	for {
		select {
		case e, open := <-w.Updates():
			switch {
			case !open: // the watch ended with wctx (or the connection)
				return a.unfinished(ctx, wctx, id, st, found, timeout)
			case e == nil: // the current value, if any, has been delivered
				if !found {
					if err := a.storedRejection(wctx, id); err != nil {
						return events.WaitReply{}, err
					}
				}
			case e.Operation() != jetstream.KeyValuePut:
				found = false // deleted or aged out
			default:
				// Each value whole: decoded over the last one, a field the
				// new state leaves out (omitempty) would keep its old value.
				var next events.TaskState
				if err := json.Unmarshal(e.Value(), &next); err != nil {
					return events.WaitReply{}, fmt.Errorf("task %s: state: %w", id, err)
				}
				st, found = next, true
				if events.Settled(st.Status) { // ended, or held: nothing happens until its type recovers
					return a.outcome(ctx, st, false), nil
				}
			}
		case m := <-rejected:
			if !found {
				return events.WaitReply{}, rejection(id, m.Header, m.Data)
			}
		case <-wctx.Done():
			return a.unfinished(ctx, wctx, id, st, found, timeout)
		}
	}
}

// unfinished answers a wait that ended before the task was settled.
func (a *API) unfinished(ctx, wctx context.Context, id string, st events.TaskState, found bool, timeout time.Duration) (events.WaitReply, error) {
	switch {
	case ctx.Err() != nil:
		return events.WaitReply{}, events.NewAPIError(events.CodeUnavailable, "the service is stopping: ask again")
	case wctx.Err() == nil:
		return events.WaitReply{}, fmt.Errorf("task %s: the watch of its state ended", id)
	case !found:
		return events.WaitReply{}, events.NewAPIError(events.CodeNotFound,
			fmt.Sprintf("task %s not found: no task with this id appeared in %s", id, timeout))
	}
	return a.outcome(ctx, st, true), nil
}

// outcome is the answer for a task in state st (services.WaitAnswer).
func (a *API) outcome(ctx context.Context, st events.TaskState, timedOut bool) events.WaitReply {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
	defer cancel()
	stream, err := a.bind(ctx, services.Stream, &a.stream)
	if err != nil {
		r := events.NewWaitReply(st) // what cannot be read in time is left out
		r.TimedOut = timedOut
		return r
	}
	return services.WaitAnswer(ctx, stream, st, timedOut)
}
