package services_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"dispatchmesh/events"
	"dispatchmesh/services"
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
