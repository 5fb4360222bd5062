package services_test

import (
	"context"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Apply with a stop (task.Block) ends a pass once: not a pass the task moved past, not a task that
// ended, and a redelivery reports no change.
func TestTaskStoreApplyStop(t *testing.T) {
	srv := natstest.Start(t)
	stores, err := services.Provision(context.Background(), srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tasks := services.NewTaskStore(stores.Tasks)
	block := func(b events.Base) func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Block(st, found, b, "blocked", events.CauseTrust)
		}
	}
	base := func(id string, pass int) events.Base {
		return events.Base{Task: events.Task{ID: id, Type: "css_fix"}, Run: events.Run{Pass: pass}}
	}
	ctx := t.Context()
	tests := []struct {
		name    string
		setup   func(id string)
		pass    int
		changed bool
		status  events.Status
	}{
		{"an unknown task is created stopped", func(string) {}, 1, true, events.StatusNeedsHumanReview},
		{"a running pass stops", func(id string) {
			st := task.New(base(id, 2).Task)
			st.Status, st.Pass = events.StatusRunning, 2
			mustCreate(t, tasks, st)
		}, 2, true, events.StatusNeedsHumanReview},
		{"a pass the task moved past does not", func(id string) {
			st := task.New(base(id, 3).Task)
			st.Status, st.Pass = events.StatusRunning, 3
			mustCreate(t, tasks, st)
		}, 2, false, events.StatusRunning},
		{"an ended task does not", func(id string) {
			st := task.New(base(id, 1).Task)
			st.Status, st.Pass = events.StatusSucceeded, 1
			mustCreate(t, tasks, st)
		}, 1, false, events.StatusSucceeded},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "t" + string(rune('a'+i))
			tt.setup(id)
			st, cause, err := tasks.Apply(ctx, id, block(base(id, tt.pass)))
			if changed := cause.Changed(); err != nil || changed != tt.changed || st.Status != tt.status {
				t.Fatalf("cause %s, status %s, err %v; want changed %v, status %s", cause, st.Status, err, tt.changed, tt.status)
			}
			if _, again, err := tasks.Apply(ctx, id, block(base(id, tt.pass))); err != nil || again.Changed() {
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
