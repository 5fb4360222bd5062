package executor_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

var testNow = time.Date(2026, 5, 18, 14, 22, 0, 0, time.UTC)

var testMessages = []events.Message{
	{Role: "system", Content: "Answer JSON: {\"status\":...}"},
	{Role: "user", Content: "Fix the <button> colour in app.css\n\"quoted\" & tabs\t."},
}

// prompted builds the message the executor consumes.
func prompted(t *testing.T, id, taskType, model string, attempt int) *services.Msg {
	t.Helper()
	in := events.Prompted{
		Base: events.Base{
			Task: events.Task{ID: id, Type: taskType, Subject: "app.css"},
			Run:  events.Run{Pass: attempt, Attempt: attempt, Rung: "REFINE", Step: "execute"},
			At:   testNow.Add(-time.Minute), By: "prompt@test",
		},
		Prompt: events.Prompt{Model: model, Messages: testMessages},
	}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	return &services.Msg{Subject: events.TaskSubject(id, events.StagePrompted), Data: data, Delivered: 1}
}

// newService builds a service with a fixed clock, logging into a buffer.
func newService(t *testing.T, cfg executor.Config) (*executor.Service, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	cfg.Log = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.Now = func() time.Time { return testNow }
	if cfg.Rand == nil {
		cfg.Rand = func() float64 { return 0.5 }
	}
	if cfg.Instance == "" {
		cfg.Instance = "executor@test"
	}
	s, err := executor.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, &logs
}

// executed checks that outs is the one Executed event of the task and returns it.
func executed(t *testing.T, id string, pass int, outs []services.Out) events.Executed {
	t.Helper()
	if len(outs) != 1 {
		t.Fatalf("got %d outputs, want 1", len(outs))
	}
	out := outs[0]
	if want := events.TaskSubject(id, events.StageExecuted); out.Subject != want {
		t.Errorf("subject %q, want %q", out.Subject, want)
	}
	if want := services.MsgID(id, pass, events.StageExecuted); out.MsgID != want {
		t.Errorf("msg id %q, want %q", out.MsgID, want)
	}
	if got := out.Header.Get(events.HeaderEvent); got != events.EventExecuted {
		t.Errorf("event header %q, want %q", got, events.EventExecuted)
	}
	var ev events.Executed
	if err := json.Unmarshal(out.Data, &ev); err != nil {
		t.Fatalf("decode executed: %v", err)
	}
	if ev.Task.ID != id || ev.Run.Pass != pass {
		t.Errorf("event is for %s pass %d, want %s pass %d", ev.Task.ID, ev.Run.Pass, id, pass)
	}
	if ev.By != "executor@test" || !ev.At.Equal(testNow) {
		t.Errorf("by %q at %v, want executor@test at %v", ev.By, ev.At, testNow)
	}
	return ev
}
