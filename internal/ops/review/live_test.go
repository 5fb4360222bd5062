package review_test

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
)

// next waits for the subscription's next change (a deadlock guard, not a
// timing assertion).
func next(t *testing.T, s *review.Subscription) review.Change {
	t.Helper()
	select {
	case c, ok := <-s.C:
		if !ok {
			t.Fatal("the feed ended")
		}
		return c
	case <-time.After(reviewtest.Patience):
		t.Fatal("no change came")
	}
	return review.Change{}
}

// One watch feeds every subscriber and the search index: a state written
// reaches both subscribers, an answer on the stream is searchable, a
// subscriber that leaves is gone, the bound holds, and Close ends every
// subscription.
func TestLiveFeedAndSearch(t *testing.T) {
	s := newSeeded(t)
	rc, err := review.New(review.Config{JS: s.srv.JS, MaxSubscribers: 2, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.put(events.TaskState{ID: "old-1", Type: "css_fix", Subject: "a.css", Status: events.StatusSucceeded, CreatedAt: s.now})
	l, err := rc.Live(bg)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := rc.Live(bg); again != l {
		t.Fatal("a second Live started another watch")
	}
	a, err := l.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Subscribe(); !errors.Is(err, review.ErrTooManySubscribers) {
		t.Fatalf("a third subscriber: %v, want ErrTooManySubscribers", err)
	}
	if err := l.Ready(bg); err != nil {
		t.Fatal(err)
	}
	s.put(events.TaskState{ID: "new-1", Type: "py_fix", Subject: "b.py", Status: events.StatusRunning, Reason: "", CreatedAt: s.now.Add(time.Second)})
	for _, sub := range []*review.Subscription{a, b} {
		if c := next(t, sub); c.ID != "new-1" || c.Status != events.StatusRunning {
			t.Fatalf("change %+v, want new-1 running", c)
		}
	}
	b.Close()
	if n := l.Subscribers(); n != 1 {
		t.Fatalf("%d subscribers after one left, want 1", n)
	}
	c, err := l.Subscribe() // the place b left
	if err != nil {
		t.Fatal(err)
	}

	s.publish(events.TaskSubject("new-1", events.StageExecuted), events.EventExecuted, nil,
		events.Executed{Base: events.Base{Task: events.Task{ID: "new-1", Type: "py_fix"}}, Result: events.Result{Outcome: events.OutcomeSuccess, Summary: "Guarded the NullPointer in parse()"}})
	s.put(events.TaskState{ID: "new-1", Type: "py_fix", Subject: "b.py", Status: events.StatusSucceeded, CreatedAt: s.now.Add(time.Second)})
	if ch := next(t, a); ch.ID != "new-1" || ch.Status != events.StatusSucceeded {
		t.Fatalf("change %+v, want new-1 succeeded", ch)
	}
	// The answer follows its own consumer: wait until the index has it.
	deadline := time.Now().Add(reviewtest.Patience)
	for {
		p, err := rc.Tasks(bg, review.TaskQuery{Text: "nullpointer"})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Tasks) == 1 && p.Tasks[0].ID == "new-1" && p.Via == review.ViaSearch {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the answer never became searchable: %+v", p)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p, err := rc.Tasks(bg, review.TaskQuery{Text: "CSS"})
	if err != nil || len(p.Tasks) != 1 || p.Tasks[0].ID != "old-1" {
		t.Fatalf("search by type: %+v %v", p, err)
	}

	rc.Close()
	for _, sub := range []*review.Subscription{a, c} {
		for range sub.C { // drains, then ends: the channel is closed
		}
	}
}
