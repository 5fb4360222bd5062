package review_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// TestCancelRunningTask cancels a task while the model answers it: the
// model's request context is cancelled, the task ends cancelled once, and
// the abandoned call is neither an attempt, nor an outcome for trust, nor
// retried.
func TestCancelRunningTask(t *testing.T) {
	m := reviewtest.Start(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("should never be recorded")}
	}, reviewtest.Options{})
	m.Model.Started = make(chan openaitest.Request, 1)
	m.Model.Block = make(chan struct{})
	m.Model.Cancelled = make(chan openaitest.Request, 1)
	defer close(m.Model.Block)
	m.Submit(events.Submit{ID: "stop-1", Type: "bug_fix", Subject: "a.go"})
	receive(t, m.Model.Started, "the model call")
	if st := m.State("stop-1"); st.Status != events.StatusRunning {
		t.Fatalf("status at the model = %s, want running", st.Status)
	}

	d, err := m.Review.Cancel(bg, "stop-1", "wrong ticket", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if d.Already || d.Task.Status != events.StatusCancelled || d.Action.Action != events.ActionCancel {
		t.Fatalf("cancel = %+v", d)
	}
	receive(t, m.Model.Cancelled, "the model's request context to be cancelled")

	again, err := m.Review.Cancel(bg, "stop-1", "", "bob")
	if err != nil || !again.Already || again.Task.Status != events.StatusCancelled {
		t.Fatalf("second cancel = %+v, %v; want Already", again, err)
	}
	waitIdle(t, m, services.ConsumerExecutor)
	waitIdle(t, m, services.ConsumerRecorder)

	st := m.State("stop-1")
	if st.Status != events.StatusCancelled || st.Attempts != 0 || len(st.History) != 0 || len(st.Actions) != 1 {
		t.Fatalf("state after cancel: status %s, %d attempts, history %+v, actions %+v", st.Status, st.Attempts, st.History, st.Actions)
	}
	all := m.Events("stop-1")
	for _, stage := range []string{events.StageExecuted, events.StageRetry, events.StageCancelled} {
		if n := timeline.Count(all, stage); n != 0 {
			t.Fatalf("%d %s events after the cancel: %v", n, stage, timeline.Stages(all))
		}
	}
	if n := timeline.Count(all, "review."+review.ReasonAction); n != 1 {
		t.Fatalf("%d action records, want exactly one: %v", n, timeline.Stages(all))
	}
	tv, err := m.Review.TrustOf(bg, "bug_fix")
	if err != nil {
		t.Fatal(err)
	}
	if tv.Outcomes != 0 {
		t.Fatalf("trust of bug_fix counts %d outcomes; the cancelled call must count none", tv.Outcomes)
	}
	if n := m.Model.Calls(); n != 1 {
		t.Fatalf("model called %d times, want 1 (the cancelled call is not retried)", n)
	}
	if _, err := m.Review.Cancel(bg, "no-such-task", "", "alice"); !errors.Is(err, review.ErrNotFound) {
		t.Fatalf("cancel of an unknown task: %v", err)
	}
}

// TestCancelEndedTask: a task that ended otherwise is not touched.
func TestCancelEndedTask(t *testing.T) {
	m := reviewtest.Start(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("fixed")}
	}, reviewtest.Options{})
	m.Submit(events.Submit{ID: "done-1", Type: "bug_fix", Subject: "b.go"})
	m.WaitStage("done-1", events.StageSucceeded, 1)
	if _, err := m.Review.Cancel(bg, "done-1", "", "alice"); !errors.Is(err, review.ErrEnded) {
		t.Fatalf("cancel of a succeeded task: %v, want ErrEnded", err)
	}
	if st := m.State("done-1"); st.Status != events.StatusSucceeded || len(st.Actions) != 0 {
		t.Fatalf("state = %s, actions %+v", st.Status, st.Actions)
	}
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(reviewtest.Patience):
		t.Fatalf("waited %s for %s", reviewtest.Patience, what)
		panic("unreachable")
	}
}

// waitIdle waits until a stage's consumer has nothing pending or unacked.
func waitIdle(t *testing.T, m *reviewtest.Mesh, durable string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, reviewtest.Patience)
	defer cancel()
	for {
		c, err := m.Srv.JS.Consumer(ctx, services.StreamOf(durable), durable)
		if err == nil {
			info, err := c.Info(ctx)
			if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("consumer %s never idle: %v", durable, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
