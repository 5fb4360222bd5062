package verifier

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

func newService(t *testing.T, cfg Config) *Service {
	t.Helper()
	cfg.Instance = "verifier@test"
	cfg.Now = func() time.Time { return testNow }
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func handle(t *testing.T, s *Service, m *services.Msg) services.Out {
	t.Helper()
	outs, err := s.Handle(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 1 {
		t.Fatalf("got %d outputs, want 1", len(outs))
	}
	return outs[0]
}

func TestHandleStaleCancelsTask(t *testing.T) {
	srv := natstest.Start(t)
	tk := testTask("t1")
	tasks := taskStore(t, srv, tk)
	respond(t, srv.NC, "verify.css", `{"exists": false, "detail": "fixed in abc123"}`)
	s := newService(t, Config{NC: srv.NC, Tasks: tasks, Policy: policyFor(policy.Verifier{Kind: "nats", Subject: "verify.css"})})

	in := queued(t, tk)
	out := handle(t, s, in)
	var c events.Cancelled
	decodeOut(t, out, "t1", 1, events.StageCancelled, events.EventCancelled, &c)
	want := events.Verification{Verdict: events.VerdictStale, Verifier: "nats", Detail: "fixed in abc123"}
	if c.Verification != want {
		t.Errorf("verification = %+v, want %+v", c.Verification, want)
	}
	if !c.At.Equal(testNow) || c.By != "verifier@test" || c.Task.ID != "t1" || c.Run.Pass != 1 || c.Run.Step != "execute" {
		t.Errorf("base = %+v", c.Base)
	}
	st := state(t, tasks, "t1")
	if st.Status != events.StatusCancelled || st.Reason != "stale: fixed in abc123" {
		t.Errorf("state = %s %q, want cancelled", st.Status, st.Reason)
	}

	// A redelivery republishes the same message id and leaves the state alone.
	again := handle(t, s, in)
	if again.MsgID != out.MsgID || again.Subject != out.Subject {
		t.Errorf("redelivery gave %s %s, want %s %s", again.Subject, again.MsgID, out.Subject, out.MsgID)
	}
	if st2 := state(t, tasks, "t1"); st2.Status != events.StatusCancelled || st2.UpdatedAt != st.UpdatedAt {
		t.Errorf("redelivery changed state: %+v", st2)
	}
}

func TestHandleExistsGoesOn(t *testing.T) {
	srv := natstest.Start(t)
	tk := testTask("t1")
	tasks := taskStore(t, srv, tk)
	s := newService(t, Config{Tasks: tasks, Policy: policyFor(policy.Verifier{Kind: "command", Command: []string{"sh", "-c", "echo still red"}})})

	var v events.Verified
	decodeOut(t, handle(t, s, queued(t, tk)), "t1", 1, events.StageVerified, events.EventVerified, &v)
	want := events.Verification{Verdict: events.VerdictExists, Verifier: "command", Detail: "still red"}
	if v.Verification != want {
		t.Errorf("verification = %+v, want %+v", v.Verification, want)
	}
	if st := state(t, tasks, "t1"); st.Status != events.StatusVerifying {
		t.Errorf("status = %s, want verifying", st.Status)
	}
}

func TestHandleVerifierError(t *testing.T) {
	failing := policy.Verifier{Kind: "command", Command: []string{"sh", "-c", "echo lint crashed; exit 3"}}
	closed := failing
	closed.FailClosed = true
	tests := []struct {
		name   string
		pv     policy.Verifier
		stage  string
		event  string
		status events.Status
	}{
		{"fail-open", failing, events.StageVerified, events.EventVerified, events.StatusVerifying},
		{"fail-closed", closed, events.StageCancelled, events.EventCancelled, events.StatusCancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := natstest.Start(t)
			tk := testTask("t1")
			tasks := taskStore(t, srv, tk)
			s := newService(t, Config{Tasks: tasks, Policy: policyFor(tt.pv)})
			var got events.Verified // Verified and Cancelled have the same shape
			decodeOut(t, handle(t, s, queued(t, tk)), "t1", 1, tt.stage, tt.event, &got)
			v := got.Verification
			if v.Verdict != events.VerdictError || v.Verifier != "command" || v.FailOpen != !tt.pv.FailClosed ||
				!strings.Contains(v.Detail, "exit status 3") || !strings.Contains(v.Detail, "lint crashed") {
				t.Errorf("verification = %+v", v)
			}
			st := state(t, tasks, "t1")
			if st.Status != tt.status {
				t.Errorf("status = %s, want %s", st.Status, tt.status)
			}
			if tt.pv.FailClosed && !strings.Contains(st.Reason, "exit status 3") {
				t.Errorf("reason = %q, want the verifier error", st.Reason)
			}
		})
	}
}

func TestHandleNoVerifierSkips(t *testing.T) {
	srv := natstest.Start(t)
	tk := testTask("t1")
	tasks := taskStore(t, srv, tk)
	for name, src := range map[string]*policy.Source{
		"no policy":   nil,
		"kind none":   policyFor(policy.Verifier{Kind: "none"}),
		"kind empty":  policyFor(policy.Verifier{}),
		"other types": policy.Static(&policy.File{Types: map[string]policy.Type{"lint": {Verifier: &policy.Verifier{Kind: "http", URL: "http://127.0.0.1:1"}}}}),
	} {
		t.Run(name, func(t *testing.T) {
			s := newService(t, Config{Tasks: tasks, Policy: src})
			var v events.Verified
			decodeOut(t, handle(t, s, queued(t, tk)), "t1", 1, events.StageVerified, events.EventVerified, &v)
			if want := (events.Verification{Verdict: events.VerdictSkipped, Verifier: "none"}); v.Verification != want {
				t.Errorf("verification = %+v, want %+v", v.Verification, want)
			}
			if st := state(t, tasks, "t1"); st.Status != events.StatusPending {
				t.Errorf("status = %s, want pending (no I/O)", st.Status)
			}
		})
	}
}

func TestHandleRetryLikeQueued(t *testing.T) {
	srv := natstest.Start(t)
	tk := testTask("t1")
	tasks := taskStore(t, srv, tk)
	s := newService(t, Config{Tasks: tasks, Policy: policyFor(policy.Verifier{Kind: "command", Command: []string{"sh", "-c", "exit 1"}})})
	retry := msg(t, "t1", events.StageRetry, events.Retry{
		Base:   events.Base{Task: tk, Run: events.Run{Pass: 3, Attempt: 2, Rung: "PIVOT", Context: "null check was wrong"}},
		Reason: "attempt 1 failed",
	})
	var c events.Cancelled
	decodeOut(t, handle(t, s, retry), "t1", 3, events.StageCancelled, events.EventCancelled, &c)
	if c.Run.Pass != 3 || c.Run.Rung != "PIVOT" || c.Run.Context != "null check was wrong" || c.Verification.Verdict != events.VerdictStale {
		t.Errorf("cancelled = %+v", c)
	}
	if st := state(t, tasks, "t1"); st.Status != events.StatusCancelled || st.Pass != 3 {
		t.Errorf("state = %s pass %d, want cancelled pass 3", st.Status, st.Pass)
	}
}

func TestHandleNATSWithoutConnFailsOpen(t *testing.T) {
	// The policy changed at runtime to a nats verifier the service cannot reach.
	s := newService(t, Config{})
	s.cfg.Policy = policyFor(policy.Verifier{Kind: "nats", Subject: "verify.css"})
	var v events.Verified
	decodeOut(t, handle(t, s, queued(t, testTask("t1"))), "t1", 1, events.StageVerified, events.EventVerified, &v)
	if v.Verification.Verdict != events.VerdictError || !v.Verification.FailOpen {
		t.Errorf("verification = %+v, want fail-open error", v.Verification)
	}
}

func TestHandleUndecodable(t *testing.T) {
	s := newService(t, Config{})
	for name, data := range map[string]string{
		"not json":   `{"task": `,
		"wrong type": `{"task": "t1"}`,
		"no task id": `{"task": {"type": "css_fix"}, "run": {"pass": 1}}`,
		"bad id":     `{"task": {"id": "a.b", "type": "css_fix"}, "run": {"pass": 1}}`,
		"null":       `null`,
	} {
		t.Run(name, func(t *testing.T) {
			m := &services.Msg{Subject: events.TaskSubject("t1", events.StageQueued), Data: []byte(data)}
			outs, err := s.Handle(context.Background(), m)
			var dead *services.DeadError
			if !errors.As(err, &dead) || dead.Reason != events.ReviewPoison || outs != nil {
				t.Fatalf("got %v, %v; want a poison DeadError", outs, err)
			}
		})
	}
}

func TestHandleShutdownNaks(t *testing.T) {
	srv := natstest.Start(t)
	tk := testTask("t1")
	tasks := taskStore(t, srv, tk)
	for name, pv := range map[string]policy.Verifier{
		"command": {Kind: "command", Command: []string{"sh", "-c", "exit 1"}},
		"http":    {Kind: "http", URL: httpVerifier(t).URL + "/slow"},
	} {
		t.Run(name, func(t *testing.T) {
			for _, ts := range []*services.TaskStore{nil, tasks} {
				s := newService(t, Config{Tasks: ts, Policy: policyFor(pv)})
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				outs, err := s.Handle(ctx, queued(t, tk))
				if !errors.Is(err, context.Canceled) || outs != nil {
					t.Fatalf("got %v, %v; want context.Canceled", outs, err)
				}
			}
			if st := state(t, tasks, "t1"); st.Status != events.StatusPending {
				t.Errorf("status = %s, want pending", st.Status)
			}
		})
	}
}

func TestNewChecksPolicy(t *testing.T) {
	natsPolicy := policyFor(policy.Verifier{Kind: "nats", Subject: "verify.css"})
	if _, err := New(Config{Policy: natsPolicy}); !errors.Is(err, ErrNoConn) {
		t.Errorf("nats verifier without a connection: err = %v, want ErrNoConn", err)
	}
	bad := policyFor(policy.Verifier{Kind: "carrier-pigeon"})
	if _, err := New(Config{Policy: bad}); err == nil {
		t.Error("unknown kind: want an error")
	}
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CheckerFor(policy.Verifier{Kind: "carrier-pigeon"}); !errors.Is(err, ErrUnknownKind) {
		t.Errorf("CheckerFor unknown kind: err = %v", err)
	}
	if !strings.HasPrefix(s.cfg.Instance, "verifier@") {
		t.Errorf("default instance = %q", s.cfg.Instance)
	}
}

// A task a human cancelled is not verified again: no check, no event.
func TestHandleSkipsTaskCancelledByHuman(t *testing.T) {
	srv := natstest.Start(t)
	tk := testTask("t1")
	tasks := taskStore(t, srv, tk)
	if _, err := tasks.Update(context.Background(), "t1", func(st *events.TaskState, _ bool) error {
		*st = task.Act(*st, events.Action{TaskID: "t1", Action: events.ActionCancel, By: "alice", At: testNow})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	checked := 0
	srvSub, err := srv.NC.Subscribe("verify.css", func(m *nats.Msg) { checked++; _ = m.Respond([]byte(`{"exists": true}`)) })
	if err != nil {
		t.Fatal(err)
	}
	defer srvSub.Unsubscribe()
	s := newService(t, Config{NC: srv.NC, Tasks: tasks, Policy: policyFor(policy.Verifier{Kind: "nats", Subject: "verify.css"})})
	outs, err := s.Handle(context.Background(), queued(t, tk))
	if err != nil || len(outs) != 0 {
		t.Fatalf("handle of a cancelled task: %d outputs, %v", len(outs), err)
	}
	if err := srv.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if checked != 0 {
		t.Fatalf("the verifier endpoint was asked %d times", checked)
	}
	if st := state(t, tasks, "t1"); st.Status != events.StatusCancelled || !task.EndedByHuman(st) {
		t.Fatalf("state = %+v", st)
	}
}
