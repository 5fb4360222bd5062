package intake

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// newAPI is an API on a fresh embedded server with the mesh provisioned.
func newAPI(t *testing.T) (*natstest.Server, *services.Stores, *API) {
	t.Helper()
	srv := natstest.Start(t)
	stores, err := services.Provision(context.Background(), srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return srv, stores, &API{JS: srv.JS, Tasks: services.NewTaskStore(stores.Tasks)}
}

// A wait answers the state it ends on, whole: a field an earlier state had
// and the final one leaves out (omitempty) is not carried over. Here the
// first attempt failed (last_error, reason) and the second succeeded.
func TestWaitAnswersTheFinalStateOnly(t *testing.T) {
	ctx := context.Background()
	srv, stores, a := newAPI(t)
	a.ctx, a.stop = context.WithCancel(ctx)
	defer a.Stop()
	put := func(st events.TaskState) uint64 {
		data, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		rev, err := stores.Tasks.Put(ctx, st.ID, data)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	pending := put(events.TaskState{ID: "w1", Type: "css_fix", Subject: "a.css", Status: events.StatusPending, Attempts: 1, Pass: 2,
		LastError: "attempt 1: null pointer", Reason: "parked (skip 1 of 2): loops exhausted", Rung: events.RungRefine})

	done := make(chan events.WaitReply, 1)
	go func() {
		r, err := a.Wait(ctx, "w1", time.Minute)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	// The wait's watch has delivered the pending state before the next.
	bucket, err := srv.JS.Stream(ctx, "KV_"+services.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 30*time.Second, "the wait to read the pending state", func() error {
		for info := range bucket.ListConsumers(ctx).Info() {
			if info.Delivered.Stream >= pending {
				return nil
			}
		}
		return errors.New("no watch has delivered it")
	})
	put(events.TaskState{ID: "w1", Type: "css_fix", Subject: "a.css", Status: events.StatusSucceeded, Attempts: 2, Pass: 2})
	r := <-done
	if r.Status != events.StatusSucceeded || r.LastError != "" || r.Reason != "" || r.Rung != "" {
		t.Fatalf("succeeded task answered with an earlier state's fields: status=%s last_error=%q reason=%q rung=%q", r.Status, r.LastError, r.Reason, r.Rung)
	}
}
