package reviewtest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Filed is one message FileQueue published on a review subject, and what
// the queue must say about it.
type Filed struct {
	Seq uint64
	// Reason is the review reason, or "action" for a human decision.
	Reason string
	Key    string
	// Type is the task type the record carries.
	Type string
	// Open: no human decision came after the record.
	Open bool
	// Answered: a rejection the submit API answered to its caller.
	Answered bool
	// Handled is the decision that closed it ("" while open); for a
	// decision, the action.
	Handled string
}

// Decision reports whether f is a human decision, not a record.
func (f Filed) Decision() bool { return f.Reason == events.ReviewAction }

// FileQueue publishes review records straight to the stream of a
// provisioned server, with the task states and human decisions a running
// mesh would have written: n groups of one record each (some followed by a
// decision, recorded in the task state too, as review actions write it),
// and every 20th group a task gated, requeued and gated again (two
// records, the first handled). It returns every record, oldest first. No
// service runs: what the review client reads is exactly this.
//
// Of every 20 groups: 8 escalated, 5 gated, 2 poison, 1 stuck, 1
// rejection the submit API answered, 1 rejection published fire and
// forget (neither has a task state), 1 requeued and gated again, 1 gated.
// Every third group (by index) is handled: resolved when even, else
// rejected. Types alternate css_fix (even) and py_fix (odd). The decisions
// are among the messages returned (Filed.Decision).
func FileQueue(t testing.TB, js jetstream.JetStream, n int) []Filed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	f := &filer{t: t, js: js, ctx: ctx,
		payload: json.RawMessage(`{"issue":"` + strings.Repeat("x", 200) + `"}`),
		at:      time.Now().UTC().Truncate(time.Millisecond)}
	for i := range n {
		f.group(i)
	}
	f.settle()
	return f.out
}

// filer publishes what FileQueue files, without waiting for each ack, and
// keeps what it filed.
type filer struct {
	t       testing.TB
	js      jetstream.JetStream
	ctx     context.Context
	payload json.RawMessage // every task's
	at      time.Time       // every decision's and task state's
	out     []Filed
	acks    []pending
}

type pending struct {
	ack jetstream.PubAckFuture
	rec int // index in out, -1 for what is not a record
}

// group files group i (see FileQueue).
func (f *filer) group(i int) {
	typ := "css_fix"
	if i%2 == 1 {
		typ = "py_fix"
	}
	handled := i%3 == 0
	action := events.ActionResolve
	if i%2 == 1 {
		action = events.ActionReject
	}
	var reason string
	var status events.Status
	switch g := i % 20; {
	case g < 8:
		reason, status = events.ReviewEscalated, events.StatusBlocked
	case g < 13 || g == 19:
		reason, status = events.ReviewGated, events.StatusNeedsHumanReview
	case g < 15:
		reason, status = events.ReviewPoison, events.StatusRunning
	case g == 15:
		reason, status = events.ReviewStuck, events.StatusBlocked
	case g == 16 || g == 17: // rejected input: no task state
		id, orig := fmt.Sprintf("api-%d", i), events.SubmitAPI
		if g == 17 {
			id, orig = fmt.Sprintf("seq-%d", i), events.SubmitSubject(typ)
		}
		h := header(events.ReviewRejected, id, "missing subject")
		h.Set(events.HeaderOrigSubj, orig)
		f.out = append(f.out, Filed{Reason: events.ReviewRejected, Key: id, Type: typ, Open: true, Answered: g == 16})
		f.publish(events.ReviewSubject(events.ReviewRejected, id), h, []byte(`{"id":"`+id+`","type":"`+typ+`"}`), len(f.out)-1)
		if handled {
			f.decide(id, events.ActionReject, len(f.out)-1)
		}
		return
	case g == 18: // gated, requeued, gated again
		id := fmt.Sprintf("r%d", i)
		first := f.record(events.ReviewGated, id, typ, header(events.ReviewGated, id, "gated once"))
		a := f.decide(id, events.ActionRequeue, first)
		f.record(events.ReviewGated, id, typ, header(events.ReviewGated, id, "gated again"))
		f.state(events.TaskState{ID: id, Type: typ, Subject: "src/" + id + ".css", Status: events.StatusNeedsHumanReview, Pass: 2,
			Actions: []events.Action{a}, CreatedAt: f.at, UpdatedAt: f.at})
		return
	}
	id := fmt.Sprintf("%c%d", reason[0], i)
	rec := f.record(reason, id, typ, header(reason, id, "why "+id))
	st := events.TaskState{ID: id, Type: typ, Subject: "src/" + id + ".css", Status: status, Pass: 1, CreatedAt: f.at, UpdatedAt: f.at}
	if handled {
		a := f.decide(id, action, rec)
		st.Actions = []events.Action{a}
		st.Status = events.StatusSucceeded
		if action == events.ActionReject {
			st.Status = events.StatusFailed
		}
	}
	f.state(st)
}

// publish sends v (JSON, or the bytes as they are) on subject; rec is
// the index in out of the record it is, -1 for none.
func (f *filer) publish(subject string, h nats.Header, v any, rec int) {
	msg := nats.NewMsg(subject)
	for k, vals := range h {
		msg.Header[k] = vals
	}
	switch b := v.(type) {
	case []byte:
		msg.Data = b
	default:
		data, err := json.Marshal(v)
		if err != nil {
			f.t.Fatal(err)
		}
		msg.Data = data
	}
	ack, err := f.js.PublishMsgAsync(msg)
	if err != nil {
		f.t.Fatalf("publish %s: %v", subject, err)
	}
	f.acks = append(f.acks, pending{ack: ack, rec: rec})
	if len(f.acks)%4000 == 0 { // bounded in flight
		select {
		case <-f.js.PublishAsyncComplete():
		case <-f.ctx.Done():
			f.t.Fatal(f.ctx.Err())
		}
	}
}

// header is the headers of a review record.
func header(reason, id, why string) nats.Header {
	h := nats.Header{}
	h.Set(events.HeaderEvent, "review."+reason+".v1")
	h.Set(events.HeaderReason, reason)
	h.Set(events.HeaderService, "seed@test")
	h.Set(events.HeaderError, why)
	if events.ValidID(id) && reason != events.ReviewRejected {
		h.Set(events.HeaderTaskID, id)
		h.Set(events.HeaderPass, "1")
	}
	return h
}

// record files a review record of task id and returns its index in out.
func (f *filer) record(reason, id, typ string, h nats.Header) int {
	task := events.Task{ID: id, Type: typ, Subject: "src/" + id + ".css", Payload: f.payload}
	b := events.Base{Task: task, Run: events.Run{Pass: 1, Attempt: 1}, By: "seed@test"}
	f.out = append(f.out, Filed{Reason: reason, Key: id, Type: typ, Open: true})
	var body any = events.Escalated{Base: b, Reason: "why " + id}
	if reason == events.ReviewGated {
		body = events.Gated{Base: b, Reason: "why " + id}
	}
	f.publish(events.ReviewSubject(reason, id), h, body, len(f.out)-1)
	return len(f.out) - 1
}

// decide files alice's decision on task id, which closes the records of
// out at closes.
func (f *filer) decide(id, action string, closes ...int) events.Action {
	a := events.Action{TaskID: id, Action: action, Note: "seeded", By: "alice", At: f.at}
	h := nats.Header{}
	h.Set(events.HeaderEvent, events.EventAction)
	h.Set(events.HeaderTaskID, id)
	h.Set(events.HeaderService, "human:alice")
	f.out = append(f.out, Filed{Reason: events.ReviewAction, Key: id, Handled: action})
	f.publish(events.ReviewSubject(events.ReviewAction, id), h, a, len(f.out)-1)
	for _, i := range closes {
		f.out[i].Open, f.out[i].Handled = false, action
	}
	return a
}

// state writes a task state to the task bucket.
func (f *filer) state(st events.TaskState) {
	data, err := json.Marshal(st)
	if err != nil {
		f.t.Fatal(err)
	}
	f.publish("$KV."+services.BucketTasks+"."+st.ID, nil, data, -1)
}

// settle waits for every ack and notes each record's stream sequence.
func (f *filer) settle() {
	select {
	case <-f.js.PublishAsyncComplete():
	case <-f.ctx.Done():
		f.t.Fatal(f.ctx.Err())
	}
	for _, p := range f.acks {
		select {
		case ack := <-p.ack.Ok():
			if p.rec >= 0 {
				f.out[p.rec].Seq = ack.Sequence
			}
		case err := <-p.ack.Err():
			f.t.Fatalf("publish %s: %v", p.ack.Msg().Subject, err)
		}
	}
}
