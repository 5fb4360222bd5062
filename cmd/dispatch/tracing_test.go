package main

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/otlptest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// `dispatch up` with OTEL_EXPORTER_OTLP_ENDPOINT set exports a task's
// spans there, and a clean stop flushes those still batched (the batch
// delay is an hour: only the flush sends them).
func TestUpExportsTraces(t *testing.T) {
	rcv := otlptest.New(t)
	pid, url, kill, out := startUpOut(t, t.TempDir(), "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.Endpoint(),
		"OTEL_BSP_SCHEDULE_DELAY=3600000", "OTEL_SERVICE_NAME=dispatch-test")
	if !strings.Contains(out.String(), "tracing: spans exported over OTLP/HTTP") {
		t.Errorf("up does not say it traces:\n%s", out.String())
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a deadlock guard
	defer cancel()
	sub, err := c.Submit(ctx, client.Task{Type: "css_fix", Subject: "src/app.css"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, sub.ID); err != nil {
		t.Fatal(err)
	}
	if p, err := os.FindProcess(pid); err != nil || p.Signal(syscall.SIGTERM) != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	// The last spans are flushed after "stopped cleanly", as the process
	// exits: wait for them, not for the line.
	want := []string{services.ConsumerIntake, services.ConsumerGate, services.ConsumerPrompt, services.ConsumerExecutor, services.ConsumerRecorder}
	stages := map[string]bool{}
	received := func() bool {
		clear(stages)
		for _, s := range rcv.Spans() {
			if s.Attrs[services.AttrTaskID] == sub.ID && s.Service == "dispatch-test" {
				stages[s.Name] = true
			}
		}
		for _, w := range want {
			if !stages[w] {
				return false
			}
		}
		return true
	}
	for !received() && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	kill()
	if !strings.Contains(out.String(), "stopped cleanly") {
		t.Errorf("up did not stop cleanly:\n%s", out.String())
	}
	for _, w := range want {
		if !stages[w] {
			t.Errorf("no %s span of the task received (got %v)", w, stages)
		}
	}
}
