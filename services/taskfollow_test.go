package services_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// nextState is the next entry of w: its status and revision ("" and 0 for
// the nil marker).
func nextState(t *testing.T, w jetstream.KeyWatcher) (events.Status, uint64) {
	t.Helper()
	select {
	case e, ok := <-w.Updates():
		if !ok {
			t.Fatal("the watch ended")
		}
		if e == nil {
			return "", 0
		}
		var st events.TaskState
		if err := json.Unmarshal(e.Value(), &st); err != nil {
			t.Fatal(err)
		}
		return st.Status, e.Revision()
	case <-time.After(patience):
		t.Fatal("no entry")
	}
	return "", 0
}

// A task's state as Follow passes it on (what a client's wait answers
// with) is the bucket's: a user who may create consumers and has them
// deliver into Follow's inbox — a "succeeded" state of its own under the
// task's very subject, the task's old state replayed from the bucket's
// stream — changes nothing, and the next real change is passed on.
func TestTaskStoreFollowTakesNoForgedState(t *testing.T) {
	s := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	kv, err := s.JS.KeyValue(ctx, services.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	store := services.NewTaskStore(kv)
	_, created, err := store.Create(ctx, task.New(events.Task{ID: "t1", Type: "css_fix", Subject: "x.css"}))
	if err != nil {
		t.Fatal(err)
	}
	running, err := store.SetStatus(ctx, events.Base{Task: events.Task{ID: "t1"}, Run: events.Run{Pass: 1}}, events.StatusRunning, "")
	if err != nil {
		t.Fatal(err)
	}
	nc, js := s.Connect(t)
	w, err := store.Follow(ctx, js, "t1")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if st, _ := nextState(t, w); st != events.StatusRunning {
		t.Fatalf("current state %q, want running", st)
	}
	if st, rev := nextState(t, w); st != "" || rev != 0 {
		t.Fatalf("%q at %d, want the nil marker", st, rev)
	}

	fake := running
	fake.Status = events.StatusSucceeded
	data, err := json.Marshal(fake)
	if err != nil {
		t.Fatal(err)
	}
	var forged []*nats.Msg
	for range 5 { // delivery sequences 1..5: one is the watcher's next
		m := nats.NewMsg("$KV." + services.BucketTasks + ".t1")
		m.Data = data
		forged = append(forged, m)
	}
	stream := natstest.ForgedStream(t, s.JS, forged...)
	for _, inbox := range s.Inboxes(t, nc) {
		natstest.Deliver(t, s.JS, stream, 0, inbox)
		natstest.Deliver(t, s.JS, "KV_"+services.BucketTasks, created.Rev, inbox)
	}
	deadline := time.Now().Add(patience)
	for w.Forged() < 5+2 { // and the two stored states
		if time.Now().After(deadline) {
			t.Fatalf("%d forged deliveries reached the watcher, want 7", w.Forged())
		}
		time.Sleep(2 * time.Millisecond)
	}
	select {
	case e := <-w.Updates():
		t.Fatalf("passed on %+v", e)
	default:
	}

	done := running
	done.Status = events.StatusFailed
	data, err = json.Marshal(done)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "t1", data)
	if err != nil {
		t.Fatal(err)
	}
	if st, got := nextState(t, w); st != events.StatusFailed || got != rev {
		t.Errorf("after the forged deliveries: %q at %d, want failed at %d", st, got, rev)
	}
}
