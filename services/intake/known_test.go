package intake

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// unnamedProblem is what a rejection of made_up says.
const unnamedProblem = `"type" "made_up" is not a task type the policy names`

// knownOnly is a policy that names css_fix only.
var knownOnly = policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": {}}})

// runIntake runs the intake service on srv under the router until the
// test ends.
func runIntake(t *testing.T, srv *natstest.Server, cfg Config) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := &services.Router{JS: srv.JS, Instance: "intake@test", Log: quiet, Grace: 5 * time.Second}
	go func() { done <- r.Run(ctx, s.Spec()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("router: %v", err)
		}
	})
}

// record waits for the last record on subject in the task stream.
func record(t *testing.T, js jetstream.JetStream, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	var m *jetstream.RawStreamMsg
	proctest.WaitFor(t, 30*time.Second, "a record on "+subject, func() error {
		s, err := js.Stream(context.Background(), services.Stream)
		if err != nil {
			return err
		}
		m, err = s.GetLastMsgForSubject(context.Background(), subject)
		return err
	})
	return m
}

// With KnownTypesOnly, intake rejects a submission of a type the policy
// does not name as it rejects invalid input: kept on
// dispatch.review.rejected.<id> with its bytes and the error, no task made;
// a named type goes on. Without it, any well-formed type is a task.
func TestKnownTypesOnlyRejectsAnUnnamedType(t *testing.T) {
	for _, only := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[only], func(t *testing.T) {
			srv := natstest.Start(t)
			stores, err := services.Provision(context.Background(), srv.JS, services.StreamConfig{})
			if err != nil {
				t.Fatal(err)
			}
			tasks := services.NewTaskStore(stores.Tasks)
			runIntake(t, srv, Config{Tasks: tasks, Policy: knownOnly, KnownTypesOnly: only, Log: quiet})

			unnamed := []byte(`{"id":"u-1","subject":"src/a.css"}`)
			for subject, data := range map[string][]byte{
				events.SubmitSubject("made_up"): unnamed,
				events.SubmitSubject("css_fix"): []byte(`{"id":"k-1","subject":"src/a.css"}`),
			} {
				if _, err := srv.JS.Publish(context.Background(), subject, data); err != nil {
					t.Fatal(err)
				}
			}
			record(t, srv.JS, events.TaskSubject("k-1", events.StageVerified)) // css_fix has no verifier
			if !only {
				record(t, srv.JS, events.TaskSubject("u-1", events.StageVerified))
				return
			}
			rec := record(t, srv.JS, events.ReviewSubject(events.ReviewRejected, "u-1"))
			if !bytes.Equal(rec.Data, unnamed) || rec.Header.Get(events.HeaderReason) != events.ReviewRejected ||
				rec.Header.Get(events.HeaderOrigSubj) != events.SubmitSubject("made_up") ||
				!strings.Contains(rec.Header.Get(events.HeaderError), unnamedProblem) {
				t.Errorf("record %q %v, want the original bytes, reason rejected and the error", rec.Data, rec.Header)
			}
			if _, err := tasks.Get(context.Background(), "u-1"); !errors.Is(err, services.ErrTaskNotFound) {
				t.Errorf("a task u-1 was made: %v", err)
			}
		})
	}
}

// The submit API answers a type the policy does not name with 400 and the
// problem, keeps it on dispatch.review.rejected.<id>, and a status of the
// id answers the rejection (422) with the same problem.
func TestAPIRejectsAnUnnamedType(t *testing.T) {
	srv, _, a := newAPI(t)
	a.Policy, a.KnownTypesOnly = knownOnly, true
	started(t, a, srv)

	body := `{"id":"u-2","type":"made_up","subject":"src/a.css"}`
	code, msg := failed(t, ask(t, srv.NC, events.SubmitAPI, body))
	if code != "400" || !strings.Contains(msg, unnamedProblem) {
		t.Errorf("answered %s %q, want 400 saying %s", code, msg, unnamedProblem)
	}
	rec := record(t, srv.JS, events.ReviewSubject(events.ReviewRejected, "u-2"))
	if string(rec.Data) != body || !strings.Contains(rec.Header.Get(events.HeaderError), unnamedProblem) {
		t.Errorf("record %q with error %q", rec.Data, rec.Header.Get(events.HeaderError))
	}
	st, err := a.Status(context.Background(), []byte("u-2"))
	var ae *events.APIError
	if !errors.As(err, &ae) || ae.Code != events.CodeRejected || len(ae.Problems) != 1 || !strings.Contains(ae.Problems[0], unnamedProblem) {
		t.Errorf("status %+v, %v: want 422 with the problem", st, err)
	}
	if code, msg := failed(t, ask(t, srv.NC, events.SubmitAPI, `{"id":"k-2","type":"css_fix","subject":"src/a.css"}`)); code != "" {
		t.Errorf("css_fix answered %s %q", code, msg)
	}
}

// A submission whose task it created before the policy stopped naming its
// type goes on when it is delivered again; another submission of that
// type is rejected.
func TestKnownTypesOnlyKeepsWhatItDecided(t *testing.T) {
	srv := natstest.Start(t)
	stores, err := services.Provision(context.Background(), srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tasks := services.NewTaskStore(stores.Tasks)
	before, err := New(Config{Tasks: tasks, Policy: policy.Static(&policy.File{Types: map[string]policy.Type{"old_fix": {}}}), KnownTypesOnly: true, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	after, err := New(Config{Tasks: tasks, Policy: knownOnly, KnownTypesOnly: true, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	msg := func(seq uint64, id string) *services.Msg {
		return &services.Msg{Subject: events.SubmitSubject("old_fix"), Data: []byte(`{"id":"` + id + `","subject":"s"}`), Seq: seq, Delivered: 1, Time: time.Now()}
	}
	ctx := context.Background()
	if out, err := before.Handle(ctx, msg(7, "o-1")); err != nil || len(out) != 2 {
		t.Fatalf("first delivery: %d outputs, %v", len(out), err)
	}
	if out, err := after.Handle(ctx, msg(7, "o-1")); err != nil || len(out) != 2 {
		t.Errorf("redelivery after the policy changed: %d outputs, %v; want it published as decided", len(out), err)
	}
	for _, m := range []*services.Msg{msg(8, "o-1"), msg(9, "o-2")} {
		_, err := after.Handle(ctx, m)
		var dead *services.DeadError
		if !errors.As(err, &dead) || dead.Reason != events.ReviewRejected || !strings.Contains(err.Error(), `"type" "old_fix" is not a task type the policy names`) {
			t.Errorf("seq %d: %v, want it rejected", m.Seq, err)
		}
	}
}

// An id submitted again with another body makes no second task and is not
// ignored: it is kept as a rejection naming what differs (the API answers
// it 409 before it is queued). The same body again is nothing to do.
func TestResubmittedWithAnotherBodyIsKeptAsARejection(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	stores, err := services.Provision(ctx, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tasks := services.NewTaskStore(stores.Tasks)
	runIntake(t, srv, Config{Tasks: tasks, JS: srv.JS, Policy: knownOnly, Log: quiet})
	for i, body := range []string{`{"id":"r-1","subject":"src/a.css"}`, `{"id":"r-1","subject":"src/a.css"}`, `{"id":"r-1","subject":"src/b.css"}`} {
		if _, err := srv.JS.Publish(ctx, events.SubmitSubject("css_fix"), []byte(body)); err != nil {
			t.Fatal(err)
		}
		if i == 0 { // the first makes the task before the others arrive
			proctest.WaitFor(t, 30*time.Second, "task r-1", func() error { _, err := tasks.Get(ctx, "r-1"); return err })
		}
	}
	s, err := srv.JS.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	var rejections []*jetstream.RawStreamMsg
	proctest.WaitFor(t, 30*time.Second, "the intake consumer done with all three", func() error {
		c, err := srv.JS.Consumer(ctx, services.SubmitStream, services.ConsumerIntake)
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending > 0 || info.NumAckPending > 0 || info.AckFloor.Stream < 3 {
			return errors.New("still busy")
		}
		return nil
	})
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(events.ReviewSubject(events.ReviewRejected, ">")))
	if err != nil {
		t.Fatal(err)
	}
	for subject := range info.State.Subjects {
		m, err := s.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			t.Fatal(err)
		}
		rejections = append(rejections, m)
	}
	if len(rejections) != 1 || rejections[0].Subject != events.ReviewSubject(events.ReviewRejected, "r-1-3") ||
		!bytes.Contains([]byte(rejections[0].Header.Get(events.HeaderError)), []byte(`"subject" differs`)) {
		var got []string
		for _, m := range rejections {
			got = append(got, m.Subject+": "+m.Header.Get(events.HeaderError))
		}
		t.Fatalf("rejections %q; want one, of the third submission, naming the subject", got)
	}
	if st, err := tasks.Get(ctx, "r-1"); err != nil || st.Subject != "src/a.css" || st.SubmitSeq != 1 {
		t.Fatalf("task r-1: %+v %v; want the first submission's", st, err)
	}
}
