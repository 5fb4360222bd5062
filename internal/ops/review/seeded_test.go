package review_test

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// seeded is a provisioned stream with hand-written events and states and no
// services running: what the review client reads is exactly what the test wrote.
type seeded struct {
	t     *testing.T
	srv   *natstest.Server
	tasks *services.TaskStore
	rc    *review.Client
	now   time.Time
}

func newSeeded(t *testing.T) *seeded {
	t.Helper()
	srv := natstest.Start(t)
	st, err := services.Provision(bg, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s := &seeded{t: t, srv: srv, tasks: services.NewTaskStore(st.Tasks), now: time.Now().UTC()}
	s.rc, err = review.New(review.Config{JS: srv.JS, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return s.now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.rc.Close) // before the server stops
	return s
}

func (s *seeded) put(st events.TaskState) {
	s.t.Helper()
	if _, err := s.tasks.Update(bg, st.ID, func(cur *events.TaskState, _ bool) error { *cur = st; return nil }); err != nil {
		s.t.Fatal(err)
	}
}

func (s *seeded) publish(subject, event string, header map[string]string, v any) {
	s.t.Helper()
	msg := nats.NewMsg(subject)
	msg.Header.Set(events.HeaderEvent, event)
	for k, val := range header {
		msg.Header.Set(k, val)
	}
	switch b := v.(type) {
	case []byte:
		msg.Data = b
	default:
		data, err := json.Marshal(v)
		if err != nil {
			s.t.Fatal(err)
		}
		msg.Data = data
	}
	if _, err := s.srv.JS.PublishMsg(bg, msg); err != nil {
		s.t.Fatal(err)
	}
}

// A task whose prompted message was dead-lettered as poison still says
// "running", but nothing of it is in flight: it can be requeued.
func TestRequeueOfPoisonedTask(t *testing.T) {
	s := newSeeded(t)
	task := events.Task{ID: "p-1", Type: "css_fix", Subject: "a.css", Payload: json.RawMessage(`{"k":1}`)}
	b := events.Base{Task: task, Run: events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine}, By: "prompt@x"}
	s.publish(events.TaskSubject("p-1", events.StageQueued), events.EventQueued, nil, events.Queued{Base: events.Base{Task: task, Run: events.Run{Pass: 1, Attempt: 1}}})
	s.publish(events.TaskSubject("p-1", events.StagePrompted), events.EventPrompted, nil, events.Prompted{Base: b})
	s.publish(events.ReviewSubject(events.ReviewPoison, "p-1"), "review.poison.v1",
		map[string]string{events.HeaderError: "failed 10 deliveries, last error: boom"}, events.Prompted{Base: b})
	s.put(events.TaskState{ID: "p-1", Type: "css_fix", Subject: "a.css", Status: events.StatusRunning, Pass: 2, Attempts: 1, LastError: "first failure"})

	d, err := s.rc.Show(bg, "p-1")
	if err != nil {
		t.Fatal(err)
	}
	if !d.Actionable || !d.CanRequeue || d.Why != "running: stopped by poison: failed 10 deliveries, last error: boom; last error: first failure" {
		t.Fatalf("detail: actionable %v (%s), why %q", d.Actionable, d.NotActionable, d.Why)
	}
	if _, err := s.rc.Requeue(bg, "p-1", "the deliveries failed on a bad template; fixed", "alice"); err != nil {
		t.Fatal(err)
	}

	// The retry is on the stream with everything the next pass needs.
	stream, err := s.srv.JS.Stream(bg, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetLastMsgForSubject(bg, events.TaskSubject("p-1", events.StageRetry))
	if err != nil {
		t.Fatal(err)
	}
	var retry events.Retry
	if err := json.Unmarshal(raw.Data, &retry); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(raw.Header.Get(jetstream.MsgIDHeader), ":retry:requeue:") {
		t.Errorf("retry Msg-Id = %q, want a salted requeue id", raw.Header.Get(jetstream.MsgIDHeader))
	}
	if string(retry.Task.Payload) != `{"k":1}` || retry.Run.Pass != 3 || retry.Run.Attempt != 2 || !retry.Run.Reviewed ||
		retry.Run.Context != "first failure" || retry.By != "alice" {
		t.Fatalf("retry = %+v", retry)
	}
	if st, _ := s.tasks.Get(bg, "p-1"); st.Status != events.StatusPending || st.Pass != 3 || st.RoundStart != 1 {
		t.Fatalf("state = %+v", st)
	}
}

func TestListFiltersCountsAndRetention(t *testing.T) {
	s := newSeeded(t)
	for _, c := range []struct {
		id, typ, reason string
		status          events.Status
	}{
		{"a-1", "css_fix", events.ReviewGated, events.StatusNeedsHumanReview},
		{"a-2", "css_fix", events.ReviewEscalated, events.StatusBlocked},
		{"b-1", "sql_fix", events.ReviewEscalated, events.StatusBlocked},
	} {
		base := events.Base{Task: events.Task{ID: c.id, Type: c.typ, Subject: "s"}, Run: events.Run{Pass: 1, Attempt: 1}}
		s.publish(events.ReviewSubject(c.reason, c.id), "review."+c.reason+".v1", map[string]string{events.HeaderError: "why " + c.id}, events.Gated{Base: base})
		s.put(events.TaskState{ID: c.id, Type: c.typ, Subject: "s", Status: c.status, Pass: 1})
	}
	s.publish(events.ReviewSubject(events.ReviewRejected, "seq-9"), events.EventRejected,
		map[string]string{events.HeaderError: "malformed JSON"}, []byte(`{"subject": "x",`))

	list := func(f review.Filter) review.Queue {
		t.Helper()
		q, err := s.rc.List(bg, f)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	q := list(review.Filter{})
	if len(q.Items) != 4 || q.Scanned != 4 || q.Next != "" {
		t.Fatalf("all: %d items, read %d, next %q", len(q.Items), q.Scanned, q.Next)
	}
	if open, err := s.rc.OpenCounts(bg); err != nil || open[events.ReviewEscalated] != 2 || open[events.ReviewRejected] != 1 || open[events.ReviewGated] != 1 {
		t.Fatalf("open counts %v, %v", open, err)
	}
	if q.Retention.MaxAge != 30*24*time.Hour || q.Retention.Msgs != 4 || !strings.Contains(q.Retention.String(), "for 30d") {
		t.Fatalf("retention = %+v", q.Retention)
	}
	if rej := q.Items[0]; rej.Key != "seq-9" || rej.TaskID != "" || rej.Raw != `{"subject": "x",` || rej.Error != "malformed JSON" {
		t.Fatalf("rejected item = %+v", rej)
	}
	if q := list(review.Filter{Type: "css_fix"}); len(q.Items) != 2 {
		t.Fatalf("by type: %+v", q.Items)
	}
	if q := list(review.Filter{Reason: events.ReviewEscalated, Type: "css_fix"}); len(q.Items) != 1 || q.Items[0].Key != "a-2" || q.Items[0].Status != events.StatusBlocked {
		t.Fatalf("by reason and type: %+v", q.Items)
	}
	s.now = s.now.Add(48 * time.Hour)
	if q := list(review.Filter{Age: 24 * time.Hour}); len(q.Items) != 0 {
		t.Fatalf("age filter kept %d old items", len(q.Items))
	}
	if q := list(review.Filter{Age: 72 * time.Hour}); len(q.Items) != 4 {
		t.Fatalf("age filter dropped recent items: %d", len(q.Items))
	}
	if _, err := s.rc.List(bg, review.Filter{Reason: "no such"}); err == nil {
		t.Fatal("a bad reason was accepted")
	}
}

func TestShowTrustAndRecords(t *testing.T) {
	s := newSeeded(t)
	// The type's outcomes, published to the outcome stream as the recorder
	// publishes them.
	for i := range 12 {
		msg, err := trust.OutcomeMsg("css_fix", trust.Outcome{Key: "k" + string(rune('a'+i)), Success: i == 5, End: true, At: s.now})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.srv.JS.PublishMsg(bg, msg); err != nil {
			t.Fatal(err)
		}
	}
	st := events.TaskState{
		ID: "s-1", Type: "css_fix", Subject: "a.css", Status: events.StatusNeedsHumanReview, Pass: 1,
		Reason:   "Blocked: css_fix trust score 0.08 below 0.15",
		History:  []events.AttemptRecord{{Attempt: 1, Pass: 1, Rung: "REFINE", Approach: "x", Outcome: "failure", Reason: "y", TokensIn: 10, Cost: 0.5}},
		DeadEnds: []events.DeadEnd{{Approach: "x", Reason: "y", Attempt: 1, Rung: "REFINE"}},
	}
	s.put(st)
	s.publish(events.ReviewSubject(events.ReviewGated, "s-1"), events.EventGated, map[string]string{events.HeaderError: st.Reason, events.HeaderService: "gate@x"},
		events.Gated{Base: events.Base{Task: events.Task{ID: "s-1", Type: "css_fix"}, Run: events.Run{Pass: 1}}, Reason: st.Reason})

	d, err := s.rc.Show(bg, "s-1")
	if err != nil {
		t.Fatal(err)
	}
	if d.Trust == nil || !d.Trust.Gated || d.Trust.Outcomes != 12 || len(d.Trust.Recent) != 12 || d.Trust.Reason != st.Reason {
		t.Fatalf("trust = %+v", d.Trust)
	}
	if len(d.Attempts) != 1 || len(d.DeadEnds) != 1 || len(d.Records) != 1 || d.Records[0].By != "gate@x" || !d.Actionable {
		t.Fatalf("detail = %+v", d)
	}
	if d.Why != "needs_human_review: "+st.Reason {
		t.Fatalf("why = %q", d.Why)
	}
	all, err := s.rc.Trust(bg)
	if err != nil || len(all) != 1 || all[0].Type != "css_fix" || all[0].Successes != 1 || all[0].Failures != 11 {
		t.Fatalf("trust = %+v, %v", all, err)
	}
	if _, err := s.rc.Show(bg, "nothing-here"); err == nil || !strings.Contains(err.Error(), "no task or review record") {
		t.Fatalf("show of an unknown id: %v", err)
	}
}

// Issue 9: a task whose queued event no later stage can decode (a payload
// nested 9,999 levels deep, accepted by an intake without a depth limit)
// was dead-lettered as poison and stayed pending, and review refused to act
// ("the mesh is working on it"). Its records carry no pass a reviewer can
// decode; the task is still actionable: resolve and reject work, and
// requeue says why it cannot send the task again.
func TestUndecodablePoisonedTaskIsActionable(t *testing.T) {
	s := newSeeded(t)
	deep := strings.Repeat("[", 9999) + strings.Repeat("]", 9999)
	for _, id := range []string{"deep-1", "deep-2"} {
		body := []byte(`{"task":{"id":"` + id + `","type":"css_fix","subject":"a.css","payload":` + deep + `},"run":{"pass":1,"attempt":1}}`)
		s.publish(events.TaskSubject(id, events.StageQueued), events.EventQueued, map[string]string{events.HeaderTaskID: id}, body)
		s.publish(events.ReviewSubject(events.ReviewPoison, id), events.EventPoison, map[string]string{
			events.HeaderTaskID: id, events.HeaderError: "undecodable dispatch.task." + id + ".queued: exceeded max depth",
			events.HeaderOrigSubj: events.TaskSubject(id, events.StageQueued),
		}, body)
		s.put(events.TaskState{ID: id, Type: "css_fix", Subject: "a.css", Status: events.StatusPending, Pass: 1})
	}

	d, err := s.rc.Show(bg, "deep-1")
	if err != nil {
		t.Fatal(err)
	}
	if !d.Actionable || d.CanRequeue || !strings.Contains(d.NoRequeue, "none of its events on the stream can be decoded") {
		t.Fatalf("detail: actionable %v (%s), can requeue %v (%s)", d.Actionable, d.NotActionable, d.CanRequeue, d.NoRequeue)
	}
	if d.Why != "pending: stopped by poison: undecodable dispatch.task.deep-1.queued: exceeded max depth" {
		t.Errorf("why = %q", d.Why)
	}
	q, err := s.rc.List(bg, review.Filter{Reason: events.ReviewPoison})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Items) != 2 || q.Items[1].TaskID != "deep-1" || q.Items[1].Type != "css_fix" { // newest first
		t.Fatalf("poison queue: %+v", q.Items)
	}

	_, err = s.rc.Requeue(bg, "deep-1", "try again", "alice")
	if !errors.Is(err, review.ErrNoTask) || !strings.Contains(err.Error(), "resolve or reject it, and submit it again") {
		t.Fatalf("requeue: %v", err)
	}
	if _, err := s.rc.Resolve(bg, "deep-1", "fixed by hand", "alice"); err != nil {
		t.Fatalf("resolve: %v", err)
	}
	if _, err := s.rc.Reject(bg, "deep-2", "payload is garbage", "alice"); err != nil {
		t.Fatalf("reject: %v", err)
	}
	for id, want := range map[string]events.Status{"deep-1": events.StatusSucceeded, "deep-2": events.StatusFailed} {
		if st, _ := s.tasks.Get(bg, id); st.Status != want {
			t.Errorf("%s: status %s, want %s", id, st.Status, want)
		}
	}
	if q, _ := s.rc.List(bg, review.Filter{}); len(q.Items) != 0 {
		t.Errorf("open items after both decisions: %+v", q.Items)
	}
}

// A poison record's pass is read from its Dispatch-Pass header when its body
// does not decode: a record of an old pass does not make a task that moved
// on actionable; one of the current pass does.
func TestPoisonPassFromHeader(t *testing.T) {
	s := newSeeded(t)
	for _, c := range []struct {
		id         string
		recordPass string
		ok         bool
	}{{"h-old", "2", false}, {"h-now", "3", true}} {
		s.publish(events.ReviewSubject(events.ReviewPoison, c.id), events.EventPoison,
			map[string]string{events.HeaderTaskID: c.id, events.HeaderPass: c.recordPass, events.HeaderError: "boom"}, []byte("{not json"))
		s.put(events.TaskState{ID: c.id, Type: "css_fix", Subject: "a.css", Status: events.StatusRunning, Pass: 3})
		d, err := s.rc.Show(bg, c.id)
		if err != nil {
			t.Fatal(err)
		}
		if d.Actionable != c.ok {
			t.Errorf("%s: actionable %v (%s), want %v", c.id, d.Actionable, d.NotActionable, c.ok)
		}
	}
}
