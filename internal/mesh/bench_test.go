package mesh_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/otlptest"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// The yardstick: the bare JetStream chain of NATS.md, five stages, each one
// consuming, decoding and encoding JSON, publishing the next message
// synchronously with a Msg-Id, then acking. Run both in one process:
//
//	go test -run '^$' -bench Chain -benchtime 3000x ./internal/mesh/
func BenchmarkChainBare(b *testing.B) {
	srv := natstest.Start(b)
	startBareChain(b, srv)
	done := countOn(b, srv.NC, "chain.done")
	payload := []byte(`{"id":"x","type":"css_fix","subject":"src/app.css","payload":{"issue":"button misaligned by 3px on the settings page"}}`)
	b.ResetTimer()
	start, cpu, msgs := time.Now(), cpuTime(), inMsgs(srv)
	for range b.N {
		if _, err := srv.JS.PublishAsync("chain.s0", payload); err != nil {
			b.Fatal(err)
		}
	}
	done.wait(b, b.N)
	report(b, srv, start, cpu, msgs)
}

// The whole mesh, every service in this process, on the simulated model.
// "spread" submits tasks over 8 types and 1000 subjects, as real traffic
// is; "hotkey" puts every task on one type and one subject, so every
// recorder contends for the same trust and history keys.
//
// "spread-traced" is "spread" with tracing on, every span exported over
// OTLP/HTTP to an in-process receiver (spans/task: those it received).
func BenchmarkChainMesh(b *testing.B) {
	b.Run("spread", func(b *testing.B) { benchMesh(b, 8, 1000, nil) })
	b.Run("hotkey", func(b *testing.B) { benchMesh(b, 1, 1, nil) })
	b.Run("spread-traced", func(b *testing.B) {
		rcv := otlptest.New(b)
		b.Setenv(tracing.EnvEndpoint, rcv.Endpoint())
		p, err := tracing.Setup(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = p.Shutdown(context.Background()) })
		benchMesh(b, 8, 1000, p.Tracer())
		if err := p.ForceFlush(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(len(rcv.Spans()))/float64(b.N+max(8*trust.DefaultWindow, 5000)), "spans/task")
	})
}

func benchMesh(b *testing.B, types, subjects int, tracer trace.Tracer) {
	srv := startMesh(b, tracer)
	done := countOn(b, srv.NC, events.StageFilter(events.StageSucceeded))
	submit := func(prefix string, i int) {
		data := fmt.Appendf(nil, `{"id":"%s%d","subject":"src/app%d.css","payload":{"issue":"button misaligned by 3px on the settings page"}}`, prefix, i, i%subjects)
		if _, err := srv.JS.PublishAsync(events.SubmitSubject(fmt.Sprintf("type_%d", i%types)), data); err != nil {
			b.Fatal(err)
		}
	}
	// A mesh in service has history: every type's trust window full (50
	// outcomes), so no type is still sending its first canaries, and every
	// subject's history holds a few outcomes.
	warm := max(types*trust.DefaultWindow, min(subjects, 1000)*5)
	for i := range warm {
		submit("w", i)
	}
	done.wait(b, warm)
	done.n.Store(0)
	b.ResetTimer()
	start, cpu, msgs := time.Now(), cpuTime(), inMsgs(srv)
	for i := range b.N {
		submit("b", i)
	}
	done.wait(b, b.N)
	report(b, srv, start, cpu, msgs)
}

// report gives the throughput, the CPU time (server and services, all in
// this process) per task and the messages clients sent the server per task
// (publishes, KV reads and writes, acks, pull requests: each a round trip
// the server handles). On a machine shared with other work the throughput
// varies from run to run; the CPU time per task much less, the messages
// per task not at all.
func report(b *testing.B, srv *natstest.Server, start time.Time, cpu time.Duration, msgs int64) {
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
	b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-µs/task")
	b.ReportMetric(float64(inMsgs(srv)-msgs)/float64(b.N), "msgs/task")
}

// inMsgs is how many messages clients have sent the server.
func inMsgs(srv *natstest.Server) int64 {
	v, err := srv.Varz(nil)
	if err != nil {
		return 0
	}
	return v.InMsgs
}

// cpuTime is the CPU time this process has used (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startMesh runs every service, on the simulated model, against a fresh
// embedded server, until the benchmark ends.
func startMesh(b testing.TB, tracer trace.Tracer) *natstest.Server {
	srv := natstest.Start(b)
	nc, _ := srv.Connect(b)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = mesh.Run(ctx, mesh.Options{NC: nc, Provision: true, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tracer: tracer})
	}()
	b.Cleanup(func() { cancel(); <-stopped })
	waitBucket(b, srv.JS)
	return srv
}

type counter struct{ n atomic.Int64 }

func countOn(b testing.TB, nc *nats.Conn, subject string) *counter {
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

func (c *counter) wait(b testing.TB, n int) {
	deadline := time.Now().Add(5 * time.Minute)
	for c.n.Load() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d finished", c.n.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitBucket(b testing.TB, js jetstream.JetStream) {
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

// Latency end to end (submit → succeeded stored) at a steady rate well below
// capacity, the mesh and the bare chain at the same rate:
//
//	go test -run '^$' -bench Latency -benchtime 2000x ./internal/mesh/
func BenchmarkLatencyMesh(b *testing.B) {
	srv := startMesh(b, nil)
	measureLatency(b, srv, events.StageFilter(events.StageSucceeded), func(i int) (string, []byte) {
		return events.SubmitSubject(fmt.Sprintf("type_%d", i%8)),
			fmt.Appendf(nil, `{"id":"l%d","subject":"src/app%d.css","payload":{"issue":"button misaligned"}}`, i, i%1000)
	}, func(m *nats.Msg) string { id, _, _ := events.ParseTaskSubject(m.Subject); return id[1:] })
}

// The bare chain at the same steady rate.
func BenchmarkLatencyBare(b *testing.B) {
	srv := natstest.Start(b)
	startBareChain(b, srv)
	measureLatency(b, srv, "chain.done", func(i int) (string, []byte) {
		return "chain.s0", fmt.Appendf(nil, `{"id":"%d","type":"css_fix","subject":"src/app.css","payload":{"issue":"button misaligned"}}`, i)
	}, func(m *nats.Msg) string {
		var v struct{ ID string }
		_ = json.Unmarshal(m.Data, &v)
		return v.ID
	})
}

// latencyRate is the steady submission rate of the latency benchmarks:
// about 40 % of what the mesh sustains on 2 cores.
const latencyRate = 400

func measureLatency(b *testing.B, srv *natstest.Server, doneSubject string, task func(i int) (string, []byte), idOf func(*nats.Msg) string) {
	sent := make([]time.Time, b.N)
	lat := make([]time.Duration, 0, b.N)
	var mu sync.Mutex
	all := make(chan struct{})
	sub, err := srv.NC.Subscribe(doneSubject, func(m *nats.Msg) {
		i, err := strconv.Atoi(idOf(m))
		if err != nil || i >= b.N {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		lat = append(lat, time.Since(sent[i]))
		if len(lat) == b.N {
			close(all)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()
	_ = srv.NC.Flush()
	b.ResetTimer()
	tick := time.NewTicker(time.Second / latencyRate)
	defer tick.Stop()
	for i := range b.N {
		<-tick.C
		subject, data := task(i)
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		if _, err := srv.JS.PublishAsync(subject, data); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d finished", len(lat), b.N)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// startBareChain runs the five stages of the bare chain.
func startBareChain(b *testing.B, srv *natstest.Server) {
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
}
