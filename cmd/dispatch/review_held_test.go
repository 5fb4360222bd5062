package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// `dispatch review list` lists the tasks held for their type's trust from
// the held index, oldest first, with the gate's reason and when each goes
// to a human (the type's hold_time in the policy), in text and JSON.
func TestReviewListShowsHeldTasks(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stores, err := services.Provision(ctx, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policykv.Put(ctx, stores.Policy, &policy.File{Types: map[string]policy.Type{"css_fix": {HoldTime: policy.Duration(2 * time.Hour)}}}); err != nil {
		t.Fatal(err)
	}
	tasks, idx := services.NewTaskStore(stores.Tasks), services.NewHeldIndex(stores.Held)
	since := time.Now().Add(-time.Hour).Truncate(time.Second)
	for i, id := range []string{"held-old", "held-new", "held-py"} {
		typ := "css_fix"
		if id == "held-py" {
			typ = "py_fix"
		}
		why := "Blocked: " + typ + " trust score 0.00 below 0.15"
		at := since.Add(time.Duration(i) * time.Minute)
		if created, _, err := tasks.Create(ctx, events.TaskState{ID: id, Type: typ, Subject: id + ".css", Status: events.StatusHeld, Pass: 1, Reason: why}); err != nil || !created {
			t.Fatalf("seed %s: %v", id, err)
		}
		if err := idx.Put(ctx, services.HeldEntry{Task: id, Type: typ, Pass: 1, Since: at, Seq: 1, Reason: why}); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("NATS_URL", srv.ClientURL())

	out, err := dispatch(t, "review", "list")
	if err != nil {
		t.Fatalf("review list: %v\n%s", err, out)
	}
	toHuman := since.Add(2 * time.Hour).Local().Format("2006-01-02 15:04:05")
	for _, s := range []string{"HELD for their type's low trust", "each type's hold time in the policy in force",
		"held-old", "Blocked: css_fix trust score 0.00 below 0.15", toHuman, "3 held.", "(no item matches)"} {
		if !strings.Contains(out, s) {
			t.Errorf("review list lacks %q:\n%s", s, out)
		}
	}
	if strings.Index(out, "held-old") > strings.Index(out, "held-new") || strings.Index(out, "held-new") > strings.Index(out, "held-py") {
		t.Errorf("held tasks are not oldest first:\n%s", out)
	}
	out, err = dispatch(t, "review", "list", "-type", "py_fix", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var q review.Queue
	if err := json.Unmarshal([]byte(out), &q); err != nil {
		t.Fatal(err)
	}
	if q.Held == nil || len(q.Held.Items) != 1 || q.Held.Items[0].TaskID != "held-py" || q.Held.Items[0].HoldTime != 24*time.Hour ||
		q.Held.Items[0].Reason != "Blocked: py_fix trust score 0.00 below 0.15" || q.Held.HoldTimeFrom != review.HoldTimeFromPolicy {
		t.Fatalf("review list -type py_fix -o json: held %+v", q.Held)
	}
	// A reason's page lists that reason's records only.
	if out, err := dispatch(t, "review", "list", "-reason", events.ReviewGated); err != nil || strings.Contains(out, "held-old") {
		t.Fatalf("review list -reason gated: %v\n%s", err, out)
	}
}
