package verifier

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

var testNow = time.Date(2026, 5, 18, 14, 22, 0, 0, time.UTC)

func testTask(id string) events.Task {
	return events.Task{
		ID: id, Type: "css_fix", Subject: "web/app.css",
		Payload:     json.RawMessage(`{"selector":".btn"}`),
		SubmittedAt: testNow.Add(-time.Hour),
	}
}

// msg wraps event v as it arrives on the task's stage subject.
func msg(t *testing.T, id, stage string, v any) *services.Msg {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return &services.Msg{Subject: events.TaskSubject(id, stage), Data: data, Delivered: 1}
}

func queued(t *testing.T, tk events.Task) *services.Msg {
	return msg(t, tk.ID, events.StageQueued, events.Queued{Base: events.Base{
		Task: tk, Run: events.Run{Pass: 1, Attempt: 1, Step: "execute"}, At: testNow.Add(-time.Minute), By: "intake@test",
	}})
}

// policyFor serves one verifier for type css_fix.
func policyFor(v policy.Verifier) *policy.Source {
	return policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": {Verifier: &v}}})
}

// taskStore creates the task bucket on srv with task's pending state in it.
func taskStore(t *testing.T, srv *natstest.Server, tk events.Task) *services.TaskStore {
	t.Helper()
	ctx := context.Background()
	kv, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: services.BucketTasks})
	if err != nil {
		t.Fatal(err)
	}
	ts := services.NewTaskStore(kv)
	if _, err := ts.Update(ctx, tk.ID, func(st *events.TaskState, _ bool) error {
		*st = task.New(tk)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ts
}

func state(t *testing.T, ts *services.TaskStore, id string) events.TaskState {
	t.Helper()
	st, err := ts.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// decodeOut checks out's routing and decodes its body into v.
func decodeOut(t *testing.T, out services.Out, id string, pass int, stage, event string, v any) {
	t.Helper()
	if want := events.TaskSubject(id, stage); out.Subject != want {
		t.Fatalf("subject = %q, want %q", out.Subject, want)
	}
	if want := services.MsgID(id, pass, stage); out.MsgID != want {
		t.Errorf("msg id = %q, want %q", out.MsgID, want)
	}
	if got := out.Header.Get(events.HeaderEvent); got != event {
		t.Errorf("event header = %q, want %q", got, event)
	}
	if err := json.Unmarshal(out.Data, v); err != nil {
		t.Fatal(err)
	}
}
