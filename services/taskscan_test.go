package services_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
)

func TestTaskStoreScan(t *testing.T) {
	s := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	kv, err := s.JS.KeyValue(ctx, services.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	store := services.NewTaskStore(kv)
	ids := func() []string {
		var got []string
		if err := store.Scan(ctx, s.JS, func(st events.TaskState) error { got = append(got, st.ID+"/"+string(st.Status)); return nil }); err != nil {
			t.Fatalf("Scan: %v", err)
		}
		slices.Sort(got)
		return got
	}
	if got := ids(); len(got) != 0 {
		t.Fatalf("empty store: %v", got)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, _, err := store.Create(ctx, task.New(events.Task{ID: id, Type: "css_fix", Subject: "x.css"})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.SetStatus(ctx, events.Base{Task: events.Task{ID: "b"}, Run: events.Run{Pass: 1}}, events.StatusRunning, ""); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if got, want := ids(), []string{"a/pending", "b/running"}; !slices.Equal(got, want) {
		t.Errorf("Scan saw %v, want the latest state of every task not deleted %v", got, want)
	}

	stop := errors.New("stop")
	n := 0
	err = store.Scan(ctx, s.JS, func(events.TaskState) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("Scan after fn's error = %v after %d calls, want fn's error after 1", err, n)
	}
}
