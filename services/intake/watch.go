package intake

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// watch answers dispatch.api.watch: the task's events, one message each,
// to the request's reply subject (an inbox: API.inbox). Clients follow a
// task through it instead of reading the stream, which they may not. Like
// a wait it is held (hold): one of the MaxWaits places, and of its
// client's MaxClientWaits.
func (a *API) watch(ctx context.Context, r *request, tr events.TaskRequest) {
	err := a.Watch(ctx, tr.ID, tr.After, tr.WaitTimeout(), func(m *nats.Msg) error {
		m.Subject = r.reply
		return a.conn().PublishMsg(m)
	})
	if err != nil {
		a.answer(r, nil, err)
		return
	}
	r.answered = true
	end := nats.NewMsg(r.reply)
	end.Header.Set(events.HeaderWatchEnd, "timeout")
	a.send(r, end)
}

// Watch sends send each event of task id stored after sequence after, in
// order, as it is stored, until timeout passes (nil) or ctx ends
// (events.CodeUnavailable). Each message keeps the event's body and
// Dispatch-* headers and names where it is stored (HeaderWatchSubject,
// HeaderWatchSeq, HeaderWatchTime); send sets its subject. The events are
// read with a follow.Follower: only what its own consumer delivers.
func (a *API) Watch(ctx context.Context, id string, after uint64, timeout time.Duration, send func(*nats.Msg) error) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	failed := make(chan error, 1)
	f, err := follow.Stream(wctx, a.JS, follow.Config{
		Stream:  services.Stream,
		Filters: []string{events.TaskFilter(id), events.ReviewTaskFilter(id)},
		After:   after,
		Log:     a.Log,
	}, func(m follow.Msg) {
		if err := send(watchMsg(m)); err != nil {
			select {
			case failed <- err:
			default:
			}
			cancel()
		}
	})
	if err != nil {
		return fmt.Errorf("watch task %s: %w", id, err)
	}
	defer f.Stop()
	select {
	case <-f.Done():
	case <-wctx.Done():
	}
	select {
	case err := <-failed:
		return fmt.Errorf("watch task %s: %w", id, err)
	default:
	}
	if ctx.Err() != nil {
		return events.NewAPIError(events.CodeUnavailable, "the service is stopping: watch again from the last event's "+events.HeaderWatchSeq)
	}
	return nil
}

// watchMsg is the message a watch sends for one stored event.
func watchMsg(m follow.Msg) *nats.Msg {
	out := nats.NewMsg("")
	for _, k := range []string{events.HeaderEvent, events.HeaderService, events.HeaderError, events.HeaderReason, events.HeaderTaskID, events.HeaderPass} {
		if v := m.Header.Get(k); v != "" {
			out.Header.Set(k, v)
		}
	}
	out.Header.Set(events.HeaderWatchSubject, m.Subject)
	out.Header.Set(events.HeaderWatchSeq, strconv.FormatUint(m.Seq, 10))
	out.Header.Set(events.HeaderWatchTime, m.Time.UTC().Format(time.RFC3339Nano))
	out.Data = m.Data
	return out
}
