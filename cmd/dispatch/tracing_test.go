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
	for !strings.Contains(out.String(), "stopped cleanly") && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	kill()
	stages := map[string]bool{}
	for _, s := range rcv.Spans() {
		if s.Attrs[services.AttrTaskID] == sub.ID && s.Service == "dispatch-test" {
			stages[s.Name] = true
		}
	}
	for _, want := range []string{services.ConsumerIntake, services.ConsumerGate, services.ConsumerPrompt, services.ConsumerExecutor, services.ConsumerRecorder} {
		if !stages[want] {
			t.Errorf("no %s span of the task received (got %v)", want, stages)
		}
	}
}
