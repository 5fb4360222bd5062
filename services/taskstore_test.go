package services_test

import (
	"context"
	"testing"

	"dispatchmesh/events"
	"dispatchmesh/internal/natstest"
	"dispatchmesh/services"
)

// Stop ends a pass once: not a pass the task moved past, not a task that
// ended, and a redelivery reports no change.
func TestTaskStoreStop(t *testing.T) {
	srv := natstest.Start(t)
	stores, err := services.Provision(context.Background(), srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tasks := services.NewTaskStore(stores.Tasks)
	block := func(st *events.TaskState) { st.Status, st.Reason = events.StatusNeedsHumanReview, "blocked" }
	base := func(id string, pass int) events.Base {
		return events.Base{Task: events.Task{ID: id, Type: "css_fix"}, Run: events.Run{Pass: pass}}
	}
	ctx := t.Context()
	tests := []struct {
		name    string
		setup   func(id string)
		pass    int
		changed bool
		status  string
	}{
		{"an unknown task is created stopped", func(string) {}, 1, true, events.StatusNeedsHumanReview},
		{"a running pass stops", func(id string) {
			st := services.NewState(base(id, 2).Task)
			st.Status, st.Pass = events.StatusRunning, 2
			mustCreate(t, tasks, st)
		}, 2, true, events.StatusNeedsHumanReview},
		{"a pass the task moved past does not", func(id string) {
			st := services.NewState(base(id, 3).Task)
			st.Status, st.Pass = events.StatusRunning, 3
			mustCreate(t, tasks, st)
		}, 2, false, events.StatusRunning},
		{"an ended task does not", func(id string) {
			st := services.NewState(base(id, 1).Task)
			st.Status, st.Pass = events.StatusSucceeded, 1
			mustCreate(t, tasks, st)
		}, 1, false, events.StatusSucceeded},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "t" + string(rune('a'+i))
			tt.setup(id)
			st, changed, err := tasks.Stop(ctx, base(id, tt.pass), block)
			if err != nil || changed != tt.changed || st.Status != tt.status {
				t.Fatalf("changed %v, status %s, err %v; want changed %v, status %s", changed, st.Status, err, tt.changed, tt.status)
			}
			if _, again, err := tasks.Stop(ctx, base(id, tt.pass), block); err != nil || again {
				t.Fatalf("a redelivered stop changed the state again (%v)", err)
			}
		})
	}
}

func mustCreate(t *testing.T, tasks *services.TaskStore, st events.TaskState) {
	t.Helper()
	if ok, _, err := tasks.Create(context.Background(), st); err != nil || !ok {
		t.Fatalf("create %s: %v %v", st.ID, ok, err)
	}
}
