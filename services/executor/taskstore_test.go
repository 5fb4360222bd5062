package executor_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

func taskStore(t *testing.T) *services.TaskStore {
	t.Helper()
	ns := natstest.Start(t)
	kv, err := ns.JS.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: services.BucketTasks})
	if err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	return services.NewTaskStore(kv)
}

// statusSpy is a Model that records the task's status when it is called.
type statusSpy struct {
	tasks  *services.TaskStore
	seen   []events.Status
	called int
}

func (s *statusSpy) Complete(ctx context.Context, req executor.Request) (executor.Response, error) {
	s.called++
	st, err := s.tasks.Get(ctx, req.TaskID)
	if err != nil {
		return executor.Response{}, err
	}
	s.seen = append(s.seen, st.Status)
	return executor.Simulated{}.Complete(ctx, req)
}

func TestHandleSetsRunningBeforeTheCall(t *testing.T) {
	ctx := context.Background()
	tasks := taskStore(t)
	spy := &statusSpy{tasks: tasks}
	s, _ := newService(t, executor.Config{Model: spy, Tasks: tasks})

	// A task the verifier already put in "verifying", and one with no state yet.
	if _, err := tasks.SetStatus(ctx, events.Base{Task: events.Task{ID: "t1", Type: "css_fix"}, Run: events.Run{Pass: 1}}, events.StatusVerifying, ""); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"t1", "t2"} {
		outs, err := s.Handle(ctx, prompted(t, id, "css_fix", "", 1))
		if err != nil {
			t.Fatalf("%s: Handle: %v", id, err)
		}
		executed(t, id, 1, outs)
		st, err := tasks.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status != events.StatusRunning || st.Pass != 1 || !st.UpdatedAt.Equal(testNow) {
			t.Errorf("%s: state %+v, want running on pass 1 at %v", id, st, testNow)
		}
	}
	if len(spy.seen) != 2 || spy.seen[0] != events.StatusRunning || spy.seen[1] != events.StatusRunning {
		t.Errorf("status seen by the model: %v, want running both times", spy.seen)
	}
}

func TestHandleSkipsATaskThatMovedOn(t *testing.T) {
	ctx := context.Background()
	tasks := taskStore(t)
	spy := &statusSpy{tasks: tasks}
	s, _ := newService(t, executor.Config{Model: spy, Tasks: tasks})

	later := events.Base{Task: events.Task{ID: "t1", Type: "css_fix"}, Run: events.Run{Pass: 3}}
	if _, err := tasks.SetStatus(ctx, later, events.StatusVerifying, ""); err != nil {
		t.Fatal(err)
	}
	done := events.Base{Task: events.Task{ID: "t2", Type: "css_fix"}, Run: events.Run{Pass: 1}}
	if _, err := tasks.SetStatus(ctx, done, events.StatusCancelled, "stale"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"t1", "t2"} {
		outs, err := s.Handle(ctx, prompted(t, id, "css_fix", "", 1))
		if err != nil || outs != nil {
			t.Errorf("%s: Handle = %v, %v; want nothing published", id, outs, err)
		}
	}
	if spy.called != 0 {
		t.Errorf("model called %d times for stale prompts, want 0", spy.called)
	}
	if st, _ := tasks.Get(ctx, "t1"); st.Status != events.StatusVerifying || st.Pass != 3 {
		t.Errorf("t1 state rewound to %+v", st)
	}
}

// The Executed event carries the task's state as the executor left it,
// with the revision of that write, for the recorder's compare-and-set; a
// task too large to carry it (MaxCarried) goes without.
func TestExecutedCarriesTheState(t *testing.T) {
	ctx := context.Background()
	tasks := taskStore(t)
	s, _ := newService(t, executor.Config{Model: executor.Simulated{}, Tasks: tasks})

	outs, err := s.Handle(ctx, prompted(t, "small", "css_fix", "", 1))
	if err != nil {
		t.Fatal(err)
	}
	ev := executed(t, "small", 1, outs)
	st, err := tasks.Get(ctx, "small")
	if err != nil {
		t.Fatal(err)
	}
	if ev.State == nil || ev.State.Rev == 0 || ev.State.State.Status != st.Status || ev.State.State.Pass != st.Pass {
		t.Fatalf("executed carries %+v, want the stored state %+v with its revision", ev.State, st)
	}
	// The revision is the stored one: a compare-and-set from it succeeds.
	if _, _, err := tasks.ApplyAt(ctx, "small", ev.State, func(st events.TaskState, _ bool) (events.TaskState, task.Cause) {
		st.Reason = "next"
		return st, task.CauseApplied
	}); err != nil {
		t.Fatal(err)
	}

	m := prompted(t, "large", "css_fix", "", 1)
	var in events.Prompted
	if err := json.Unmarshal(m.Data, &in); err != nil {
		t.Fatal(err)
	}
	in.Task.Payload, _ = json.Marshal(strings.Repeat("x", executor.MaxCarried))
	if m.Data, err = json.Marshal(in); err != nil {
		t.Fatal(err)
	}
	if outs, err = s.Handle(ctx, m); err != nil {
		t.Fatal(err)
	}
	if ev := executed(t, "large", 1, outs); ev.State != nil {
		t.Fatalf("a task over MaxCarried carries its state (%d bytes)", len(outs[0].Data))
	}
}

// A state sealed by a service that writes it spares the executor its read;
// a seal its key does not open is ignored (it reads), and a seal made stale
// by a later write — a human's cancel — fails the compare-and-set: the
// executor reads, finds the task ended and calls nothing.
func TestSealedStateSparesTheRead(t *testing.T) {
	ctx := context.Background()
	ns := natstest.Start(t)
	kv, err := ns.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: services.BucketTasks})
	if err != nil {
		t.Fatal(err)
	}
	key := func(b byte) *services.Sealer {
		s, err := services.NewSealer([]byte(strings.Repeat(string(b), services.MinStateKey)))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	counted := &natstest.CountReads{KeyValue: kv}
	tasks := services.NewTaskStore(counted).Sealing(key('k'))
	intake := services.NewTaskStore(kv).Sealing(key('k'))
	stranger := services.NewTaskStore(kv).Sealing(key('x'))
	s, _ := newService(t, executor.Config{Model: executor.Simulated{}, Tasks: tasks})

	sealedBy := func(store *services.TaskStore, id string) *services.Msg {
		t.Helper()
		m := prompted(t, id, "css_fix", "", 1)
		var in events.Prompted
		if err := json.Unmarshal(m.Data, &in); err != nil {
			t.Fatal(err)
		}
		created, at, err := intake.Create(ctx, task.Queued(in.Task, in.Run, 1))
		if err != nil || !created {
			t.Fatalf("create %s: %v", id, err)
		}
		if in.Sealed = store.Seal(at); in.Sealed == nil {
			t.Fatal("nothing sealed")
		}
		if m.Data, err = json.Marshal(in); err != nil {
			t.Fatal(err)
		}
		return m
	}
	handle := func(m *services.Msg) ([]services.Out, int) {
		t.Helper()
		before := counted.Reads()
		outs, err := s.Handle(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return outs, counted.Reads() - before
	}

	outs, n := handle(sealedBy(intake, "sealed"))
	if ev := executed(t, "sealed", 1, outs); n != 0 || ev.Result.Outcome != events.OutcomeSuccess {
		t.Fatalf("sealed state: %d reads, outcome %q; want 0 reads and a success", n, ev.Result.Outcome)
	}
	if st, _ := tasks.Get(ctx, "sealed"); st.Status != events.StatusRunning {
		t.Fatalf("stored after the attempt: status %s, want running", st.Status)
	}

	outs, n = handle(sealedBy(stranger, "forged"))
	if ev := executed(t, "forged", 1, outs); n == 0 || ev.Result.Outcome != events.OutcomeSuccess {
		t.Fatalf("a seal of another key: %d reads, outcome %q; want a read and a success", n, ev.Result.Outcome)
	}

	m := sealedBy(intake, "cancelled")
	if _, _, err := intake.Apply(ctx, "cancelled", func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.Cancel(st, found, events.Base{Task: events.Task{ID: "cancelled"}, Run: events.Run{Pass: 1, Attempt: 1}},
			events.Verification{Verdict: events.VerdictStale, Detail: "fixed by hand"})
	}); err != nil {
		t.Fatal(err)
	}
	if outs, n = handle(m); len(outs) != 0 || n == 0 {
		t.Fatalf("a task cancelled after its seal: %d outputs, %d reads; want none and a read", len(outs), n)
	}
}
