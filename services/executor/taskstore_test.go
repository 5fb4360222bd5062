package executor_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/internal/natstest"
	"dispatchmesh/internal/task"
	"dispatchmesh/services"
	"dispatchmesh/services/executor"
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
