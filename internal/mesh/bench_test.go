package mesh_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/internal/mesh"
	"dispatchmesh/internal/natstest"
)

// The yardstick: the bare JetStream chain of NATS.md, five stages, each one
// consuming, decoding and encoding JSON, publishing the next message
// synchronously with a Msg-Id, then acking. Run both in one process:
//
//	go test -run '^$' -bench Chain -benchtime 3000x ./internal/mesh/
func BenchmarkChainBare(b *testing.B) {
	srv := natstest.Start(b)
	ctx := context.Background()
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "CHAIN", Subjects: []string{"chain.>"}}); err != nil {
		b.Fatal(err)
	}
	const stages = 5
	for i := range stages {
		nc, js := srv.Connect(b)
		_ = nc
		cons, err := js.CreateOrUpdateConsumer(ctx, "CHAIN", jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("s%d", i), FilterSubject: fmt.Sprintf("chain.s%d", i), AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			b.Fatal(err)
		}
		next := fmt.Sprintf("chain.s%d", i+1)
		if i == stages-1 {
			next = "chain.done"
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			var v map[string]any
			_ = json.Unmarshal(m.Data(), &v)
			v["stage"] = i
			data, _ := json.Marshal(v)
			md, _ := m.Metadata()
			if _, err := js.Publish(ctx, next, data, jetstream.WithMsgID(fmt.Sprintf("%d:%d", md.Sequence.Stream, i))); err != nil {
				_ = m.Nak()
				return
			}
			_ = m.Ack()
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cc.Stop)
	}
	done := countOn(b, srv.NC, "chain.done")
	payload := []byte(`{"id":"x","type":"css_fix","subject":"src/app.css","payload":{"issue":"button misaligned by 3px on the settings page"}}`)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, err := srv.JS.PublishAsync("chain.s0", payload); err != nil {
			b.Fatal(err)
		}
	}
	done.wait(b, b.N)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
}

// The whole mesh, every service in this process, on the simulated model.
// "spread" submits tasks over 8 types and 1000 subjects, as real traffic
// is; "hotkey" puts every task on one type and one subject, so every
// recorder contends for the same trust and history keys.
func BenchmarkChainMesh(b *testing.B) {
	b.Run("spread", func(b *testing.B) { benchMesh(b, 8, 1000) })
	b.Run("hotkey", func(b *testing.B) { benchMesh(b, 1, 1) })
}

func benchMesh(b *testing.B, types, subjects int) {
	srv := natstest.Start(b)
	nc, _ := srv.Connect(b)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = mesh.Run(ctx, mesh.Options{NC: nc, Provision: true, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	b.Cleanup(func() { cancel(); <-stopped })
	waitBucket(b, srv.JS)
	done := countOn(b, srv.NC, events.StageFilter(events.StageSucceeded))
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		data := fmt.Appendf(nil, `{"id":"b%d","subject":"src/app%d.css","payload":{"issue":"button misaligned by 3px on the settings page"}}`, i, i%subjects)
		if _, err := srv.JS.PublishAsync(events.SubmitSubject(fmt.Sprintf("type_%d", i%types)), data); err != nil {
			b.Fatal(err)
		}
	}
	done.wait(b, b.N)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
}

type counter struct{ n atomic.Int64 }

func countOn(b *testing.B, nc *nats.Conn, subject string) *counter {
	c := &counter{}
	sub, err := nc.Subscribe(subject, func(*nats.Msg) { c.n.Add(1) })
	if err != nil {
		b.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	_ = nc.Flush()
	return c
}

func (c *counter) wait(b *testing.B, n int) {
	deadline := time.Now().Add(5 * time.Minute)
	for c.n.Load() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d finished", c.n.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitBucket(b *testing.B, js jetstream.JetStream) {
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := js.KeyValue(context.Background(), "dispatch_tasks"); err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("mesh never provisioned")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
