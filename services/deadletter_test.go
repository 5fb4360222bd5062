package services_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// A dead-lettered message is filed under the task it belongs to, with the
// task and pass in headers, read without relying on its body: the body is
// often what failed.
func TestDeadLetterFilesUnderTheTask(t *testing.T) {
	stored := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	hdr := func(kv ...string) nats.Header {
		h := nats.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, c := range []struct {
		name     string
		subject  string
		header   nats.Header
		data     string
		reason   string
		key      string
		wantSubj string
		wantTask string // Dispatch-Task-Id of the record
		wantPass string // Dispatch-Pass of the record
	}{
		{
			name: "undecodable event with headers", subject: events.TaskSubject("t-1", events.StageQueued),
			header: hdr(events.HeaderTaskID, "t-1", events.HeaderPass, "3"), data: `{"task":` + deep + `}`,
			reason: events.ReviewPoison, wantSubj: "dispatch.review.poison.t-1", wantTask: "t-1", wantPass: "3",
		},
		{
			name: "event without headers: pass from its body", subject: events.TaskSubject("t-2", events.StagePrompted),
			header: hdr(), data: `{"run":{"pass":2}}`,
			reason: events.ReviewPoison, wantSubj: "dispatch.review.poison.t-2", wantTask: "t-2", wantPass: "2",
		},
		{
			name: "undecodable event without headers: the subject names the task", subject: events.TaskSubject("t-3", events.StageQueued),
			header: hdr(), data: deep,
			reason: events.ReviewPoison, wantSubj: "dispatch.review.poison.t-3", wantTask: "t-3",
		},
		{
			name: "a submission that failed: filed under its id", subject: events.SubmitSubject("css_fix"),
			header: hdr(), data: `{"id":"s-1","subject":"a.css"}`,
			reason: events.ReviewPoison, wantSubj: "dispatch.review.poison.s-1", wantTask: "s-1", wantPass: "1",
		},
		{
			name: "a submission without an id: under the id intake generates", subject: events.SubmitSubject("css_fix"),
			header: hdr(), data: `{"subject":"a.css"}`,
			reason:   events.ReviewPoison,
			wantSubj: "dispatch.review.poison." + events.GeneratedID(7, stored), wantTask: events.GeneratedID(7, stored), wantPass: "1",
		},
		{
			name: "an invalid submission makes no task", subject: events.SubmitSubject("css_fix"),
			header: hdr(), data: `{"subject":`,
			reason: events.ReviewPoison, wantSubj: "dispatch.review.poison.seq-7",
		},
		{
			name: "a rejection keyed by the id it read claims no task", subject: events.SubmitSubject("css_fix"),
			header: hdr(), data: `{"id":"r-1","subject":7}`, key: "r-1",
			reason: events.ReviewRejected, wantSubj: "dispatch.review.rejected.r-1",
		},
		{
			name: "an invalid task id in the header (copied as it was)", subject: "dispatch.task.x.queued",
			header: hdr(events.HeaderTaskID, "a.b"), data: `{}`,
			reason: events.ReviewPoison, wantSubj: "dispatch.review.poison.seq-7", wantTask: "a.b",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := &services.Msg{Subject: c.subject, Header: c.header, Data: []byte(c.data), Seq: 7, Time: stored}
			out := services.DeadLetter(m, services.Stream, c.reason, c.key, errors.New("boom"))
			if out.Subject != c.wantSubj || string(out.Data) != c.data || out.MsgID != "review:DISPATCH:7" {
				t.Fatalf("record on %s, Msg-Id %s, %d bytes", out.Subject, out.MsgID, len(out.Data))
			}
			if got := out.Header.Get(events.HeaderTaskID); got != c.wantTask {
				t.Errorf("Dispatch-Task-Id = %q, want %q", got, c.wantTask)
			}
			if got := out.Header.Get(events.HeaderPass); got != c.wantPass {
				t.Errorf("Dispatch-Pass = %q, want %q", got, c.wantPass)
			}
			if out.Header.Get(events.HeaderError) != "boom" || out.Header.Get(events.HeaderOrigSubj) != c.subject || out.Header.Get(events.HeaderOrigSeq) != "7" {
				t.Errorf("headers %v", out.Header)
			}
		})
	}
}

// Every task event carries its task and pass in headers.
func TestEventsCarryTaskAndPass(t *testing.T) {
	b := events.Base{Task: events.Task{ID: "t-1"}, Run: events.Run{Pass: 4}}
	next, err := services.Next(b, events.StageVerified, events.EventVerified, events.Verified{Base: b})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := services.ToReview(b, events.ReviewGated, events.EventGated, "why", events.Gated{Base: b})
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []services.Out{next, rev} {
		if out.Header.Get(events.HeaderTaskID) != "t-1" || out.Header.Get(events.HeaderPass) != "4" {
			t.Errorf("%s: headers %v", out.Subject, out.Header)
		}
	}
}

// DeadLetters decides each failure's fate and files the review records.
func TestDeadLetters(t *testing.T) {
	failing := func(err error) services.Handler {
		return func(context.Context, *services.Msg) ([]services.Out, error) { return nil, err }
	}
	busy := services.Snooze(5*time.Second, errors.New("busy"))
	plain := errors.New("x")
	for _, c := range []struct {
		name      string
		err       error
		delivered int
		shutdown  bool
		pubErr    error
		want      services.Fate // Err compared by its text
		record    string        // subject of the review record; "" none
		cause     string        // its error header
	}{
		{name: "success", delivered: 1, want: services.Fate{Action: services.ActionAck, Result: services.ResultOK}},
		{name: "snooze", err: busy, delivered: 1,
			want: services.Fate{Action: services.ActionNak, Delay: 5 * time.Second, Result: services.ResultSnoozed, Err: busy}},
		{name: "snoozed on the last delivery: poison", err: busy, delivered: 3,
			want:   services.Fate{Action: services.ActionTerm, Reason: events.ReviewPoison, Result: services.ResultDead, Err: errors.New("still snoozed after 3 deliveries: snoozed for 5s: busy")},
			record: "dispatch.review.poison.t1", cause: "still snoozed after 3 deliveries: snoozed for 5s: busy"},
		{name: "dead", err: services.Dead(events.ReviewRejected, errors.New("no good")), delivered: 1,
			want:   services.Fate{Action: services.ActionTerm, Reason: events.ReviewRejected, Result: services.ResultDead, Err: errors.New("rejected: no good")},
			record: "dispatch.review.rejected.t1", cause: "no good"},
		{name: "dead with a key, at shutdown", err: services.DeadKey(events.ReviewRejected, "k1", errors.New("no good")), delivered: 1, shutdown: true,
			want:   services.Fate{Action: services.ActionTerm, Reason: events.ReviewRejected, Result: services.ResultDead, Err: errors.New("rejected: no good")},
			record: "dispatch.review.rejected.k1", cause: "no good"},
		{name: "failure: backoff", err: plain, delivered: 2,
			want: services.Fate{Action: services.ActionNak, Delay: 2 * time.Second, Result: services.ResultRetried, Err: plain}},
		{name: "failure on the last delivery: poison", err: plain, delivered: 3,
			want:   services.Fate{Action: services.ActionTerm, Reason: events.ReviewPoison, Result: services.ResultDead, Err: errors.New("failed 3 deliveries, last error: x")},
			record: "dispatch.review.poison.t1", cause: "failed 3 deliveries, last error: x"},
		{name: "failure at shutdown: handed back at once", err: plain, delivered: 3, shutdown: true,
			want: services.Fate{Action: services.ActionNak, Result: services.ResultShutdown, Err: plain}},
		{name: "the record cannot be published: handed back, uncounted", err: plain, delivered: 3, pubErr: errors.New("no stream"),
			want:   services.Fate{Action: services.ActionNak, Delay: 3 * time.Second, Result: services.ResultNone, Err: errors.New("dead-letter to review poison failed: no stream; cause: failed 3 deliveries, last error: x")},
			record: "dispatch.review.poison.t1", cause: "failed 3 deliveries, last error: x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var published []services.Out
			mw := services.DeadLetters(services.Spec{MaxDeliver: 3, Backoff: func(n int) time.Duration { return time.Duration(n) * time.Second }},
				func(ctx context.Context, out services.Out) error {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					published = append(published, out)
					return c.pubErr
				})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.shutdown {
				cancel()
			}
			m := &services.Msg{Subject: events.TaskSubject("t1", "in"), Header: nats.Header{events.HeaderTaskID: {"t1"}}, Data: []byte("bytes"), Seq: 7, Delivered: c.delivered}
			_, err := mw(failing(c.err))(ctx, m)
			got := services.FateOf(err)
			if got.Action != c.want.Action || got.Delay != c.want.Delay || got.Reason != c.want.Reason || got.Result != c.want.Result ||
				fmt.Sprint(got.Err) != fmt.Sprint(c.want.Err) {
				t.Fatalf("fate %+v (%v), want %+v (%v)", *got, got.Err, c.want, c.want.Err)
			}
			if c.want.Err != nil && !errors.Is(err, c.err) {
				t.Errorf("%v does not wrap the handler's %v", err, c.err)
			}
			if c.record == "" {
				if len(published) != 0 {
					t.Fatalf("published %v", published)
				}
				return
			}
			if len(published) != 1 || published[0].Subject != c.record || string(published[0].Data) != "bytes" || published[0].MsgID != "review:DISPATCH:7" {
				t.Fatalf("published %+v, want one record on %s", published, c.record)
			}
			if got := published[0].Header.Get(events.HeaderError); got != c.cause {
				t.Errorf("error header %q, want %q", got, c.cause)
			}
		})
	}
}
