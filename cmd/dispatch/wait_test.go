package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// runMesh runs the named services on their own connection until cleanup.
func runMesh(t *testing.T, srv *natstest.Server, names ...string) {
	t.Helper()
	nc, _ := srv.Connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- mesh.Run(ctx, mesh.Options{NC: nc, Services: names, Provision: true,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mesh %v: %v", names, err)
		}
	})
}

// -wait says where a task waits and for how long while nothing happens,
// then prints the final answer once it has one.
func TestWaitShowsTheStageThenTheAnswer(t *testing.T) {
	srv := natstest.Start(t)
	runMesh(t, srv, mesh.Intake) // nothing runs after intake: the task waits at the gate (css_fix has no verifier: verified at once)
	c, err := client.New(srv.NC)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a deadlock guard
	defer cancel()
	var sub client.Submitted
	for { // until the API answers
		sub, err = c.Submit(ctx, client.Task{ID: "slow-1", Type: "css_fix", Subject: "a.css"})
		if !errors.Is(err, client.ErrUnavailable) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	waited := make(chan error, 1)
	go func() { waited <- waitFor(ctx, &out, c, sub.ID, 20*time.Millisecond) }()
	for !strings.Contains(out.String(), "still at stage verified for ") {
		if ctx.Err() != nil {
			t.Fatalf("no progress line:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}

	runMesh(t, srv, mesh.Verifier, mesh.Gate, mesh.Prompt, mesh.Executor, mesh.Recorder)
	if err := <-waited; err != nil {
		t.Fatalf("wait: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{"verified", "succeeded after 1 attempt(s)", "summary: SIMULATED", "change: "} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "\r") {
		t.Errorf("a status line was rewritten in place on a buffer, not a terminal:\n%q", got)
	}
	// Every progress line came before the answer.
	if i, j := strings.LastIndex(got, "still at stage"), strings.Index(got, "succeeded after"); i > j {
		t.Errorf("progress after the outcome:\n%s", got)
	}
}

func TestStillAt(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		last client.Event
		now  time.Time
		want string
	}{
		{client.Event{}, start.Add(3 * time.Second), "waiting for the task to start for 3s"},
		{client.Event{Stage: "executor", Time: start.Add(time.Second)}, start.Add(13400 * time.Millisecond), "still at stage executor for 12s"},
		{client.Event{Stage: "queued", Time: start.Add(time.Second)}, start, "still at stage queued for 0s"}, // clocks apart
	} {
		if got := stillAt(c.last, start, c.now); got != c.want {
			t.Errorf("stillAt(%+v) = %q, want %q", c.last, got, c.want)
		}
	}
}
