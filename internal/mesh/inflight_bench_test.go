package mesh_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// inflightTasks is how many tasks BenchmarkInFlight has in flight at once,
// and inflightThink how long the scripted model takes to answer each.
const (
	inflightTasks = 1000
	inflightThink = 2 * time.Second
)

// BenchmarkInFlight puts 1,000 tasks of one type through the whole mesh at
// once, with ONE executor instance (concurrency 1,000) calling a scripted
// OpenAI-compatible server over HTTP that answers every call after 2 s: the
// cost of a model call in flight. It reports the wall time from the first
// submit to the last stored `succeeded`, the redeliveries (messages of any
// consumer acked, nak'ed or extended on a delivery after their first), the
// process's peak RSS (VmHWM, reset at the start; server, services, model
// server and benchmark all in this process), the peak number of goroutines
// and the CPU time per task. The type is exempt and sends no canaries, as a
// type in service would. Run it alone, so the peak RSS is its own:
//
//	go test -run '^$' -bench InFlight -benchtime 1x -count 3 ./internal/mesh/
func BenchmarkInFlight(b *testing.B) { benchInFlight(b, benchPolicy()) }

// BenchmarkColdStart is BenchmarkInFlight with the default policy: each
// run's 1,000 tasks are of a brand-new type (a type of its own per run),
// so the gate holds all but the canaries until their outcomes score the
// type, then lets the rest through. Its wall-s is the cold start of SPEC
// issue #21: at most about one model call's time more than the in-flight
// run's (one round of canaries).
//
//	go test -run '^$' -bench ColdStart -benchtime 1x -count 3 ./internal/mesh/
func BenchmarkColdStart(b *testing.B) {
	benchInFlight(b, policy.Static(&policy.File{}))
}

func benchInFlight(b *testing.B, pol *policy.Source) {
	var calls callSpan
	model := openaitest.New(b, func(int, openaitest.Request) openaitest.Reply {
		calls.mark()
		time.Sleep(inflightThink)
		return openaitest.Reply{Content: openaitest.Success("fix the selector")}
	})
	srv := startModelMesh(b, model, map[string]int{mesh.Executor: inflightTasks}, pol)
	redelivered := countRedeliveries(b, srv.NC)
	done := countOn(b, srv.NC, events.StageFilter(events.StageSucceeded))
	resetPeakRSS(b)
	peakG := sampleGoroutines(b)
	b.ResetTimer()
	var wall time.Duration
	cpu := cpuTime()
	for n := range b.N {
		start := time.Now()
		calls.reset(start)
		for i := range inflightTasks {
			submitModelTask(b, srv, fmt.Sprintf("inflight%d", n), fmt.Sprintf("f%d_%d", n, i), i)
		}
		done.wait(b, (n+1)*inflightTasks)
		wall += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(wall.Seconds()/float64(b.N), "wall-s")
	first, last := calls.span()
	b.ReportMetric(first.Seconds(), "first-call-s")
	b.ReportMetric(last.Seconds(), "last-call-s")
	b.ReportMetric(float64(redelivered.n.Load()), "redeliveries")
	b.ReportMetric(float64(peakRSS(b))/(1<<20), "peak-rss-MB")
	b.ReportMetric(float64(peakG()), "peak-goroutines")
	b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N*inflightTasks), "cpu-µs/task")
}

// callSpan keeps when the first and the last of a run's model calls
// arrived, since the run's start.
type callSpan struct {
	mu          sync.Mutex
	start       time.Time
	first, last time.Duration
}

func (t *callSpan) reset(start time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start, t.first, t.last = start, 0, 0
}

func (t *callSpan) mark() {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := time.Since(t.start)
	if t.first == 0 {
		t.first = d
	}
	t.last = d
}

func (t *callSpan) span() (first, last time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.first, t.last
}

// benchPolicy makes every type exempt from the gate with no canaries: the
// benchmarks measure the mesh's overhead, not the gate's caution with a
// type it has never seen.
func benchPolicy() *policy.Source {
	yes, zero := true, 0
	return policy.Static(&policy.File{Defaults: policy.Type{Exempt: &yes, Canary: &zero}})
}

// startModelMesh runs every service against a fresh embedded server, the
// executor calling model over HTTP, until the benchmark ends.
func startModelMesh(b testing.TB, model *openaitest.Server, concurrency map[string]int, pol *policy.Source) *natstest.Server {
	srv := natstest.Start(b)
	nc, _ := srv.Connect(b)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = mesh.Run(ctx, mesh.Options{
			NC: nc, Provision: true, Policy: pol, Log: benchLog(b), ServiceConcurrency: concurrency,
			Model: executor.NewOpenAI(executor.OpenAIConfig{BaseURL: model.BaseURL(), APIKey: "test"}),
		})
	}()
	b.Cleanup(func() { cancel(); <-stopped })
	waitBucket(b, srv.JS)
	return srv
}

// submitModelTask submits task id of taskType; its payload carries #n#,
// which the prompt carries to the model.
func submitModelTask(b testing.TB, srv *natstest.Server, taskType, id string, n int) {
	if _, err := srv.JS.PublishAsync(events.SubmitSubject(taskType), modelTask(id, n)); err != nil {
		b.Fatal(err)
	}
}

// modelTask is the submission of task id, on subject n%1000, carrying #n#.
func modelTask(id string, n int) []byte {
	return fmt.Appendf(nil, `{"id":"%s","subject":"src/app%d.css","payload":{"issue":"button misaligned","n":"#%d#"}}`, id, n%1000, n)
}

// taskNumber is the #n# of a model request, -1 if none.
func taskNumber(body []byte) int {
	_, rest, ok := bytes.Cut(body, []byte("#"))
	if !ok {
		return -1
	}
	digits, _, ok := bytes.Cut(rest, []byte("#"))
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(string(digits))
	if err != nil {
		return -1
	}
	return n
}

// countRedeliveries counts, from the acks, naks and progress reports the
// services send, the messages of the task stream settled on a delivery
// after their first (each counted once). The ack subject carries the
// delivery count: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.… (or
// with domain and account tokens first).
func countRedeliveries(b testing.TB, nc *nats.Conn) *counter {
	c := &counter{}
	var mu sync.Mutex
	seen := map[string]bool{}
	sub, err := nc.Subscribe("$JS.ACK."+services.Stream+".>", func(m *nats.Msg) {
		t := strings.Split(m.Subject, ".")
		at := 4
		if len(t) >= 12 {
			at = 6
		}
		if len(t) <= at+1 {
			return
		}
		if d, err := strconv.Atoi(t[at]); err != nil || d < 2 {
			return
		}
		key := t[at-1] + "." + t[at+1]
		mu.Lock()
		defer mu.Unlock()
		if !seen[key] {
			seen[key] = true
			c.n.Add(1)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	_ = nc.Flush()
	return c
}

// resetPeakRSS resets the process's VmHWM to its current RSS (Linux),
// once the memory earlier runs freed is given back.
func resetPeakRSS(b testing.TB) {
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset the peak RSS: %v", err)
	}
}

// peakRSS is the process's VmHWM in bytes.
func peakRSS(b testing.TB) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Logf("no /proc/self/status: %v", err)
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// sampleGoroutines samples runtime.NumGoroutine every 10 ms until the
// benchmark ends; peak returns the highest seen.
func sampleGoroutines(b testing.TB) (peak func() int) {
	var top atomic.Int64
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if n := int64(runtime.NumGoroutine()); n > top.Load() {
					top.Store(n)
				}
			}
		}
	}()
	b.Cleanup(func() { close(stop) })
	return func() int { return int(top.Load()) }
}

// percentile is the p-th percentile (0–100) of sorted ds, in ms.
func percentile(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	return float64(ds[min(len(ds)-1, len(ds)*p/100)].Microseconds()) / 1000
}

// Open-loop latency through the whole mesh with the executor calling a
// scripted OpenAI-compatible server over HTTP that answers at once. In one
// run: warm the mesh (500 tasks), measure its saturation rate (2,000 tasks
// submitted at once, over 8 types and 1,000 subjects, tasks/s until the
// last is recorded), then submit b.N tasks at half that rate on a fixed
// schedule. Every latency counts from the task's INTENDED send time, so a
// late sender or a stalled mesh adds to it instead of hiding it
// (coordinated omission). It reports p50 and p99 of submit → the model
// server receiving the call (`call`), the model server answering → the
// `succeeded` event stored and delivered (`record`), and submit →
// `succeeded` (`e2e`), the saturation rate and the CPU time per task at
// it (`sat-`), the rate used and the CPU time per task at that rate:
//
//	go test -run '^$' -bench 'OpenLoop$' -benchtime 2000x -count 3 ./internal/mesh/
func BenchmarkOpenLoop(b *testing.B) {
	const warm, burst = 500, 2000
	total := warm + burst + b.N
	calls, answers, recorded := make([]time.Time, total), make([]time.Time, total), make([]time.Time, total)
	var mu sync.Mutex
	model := openaitest.New(b, func(_ int, req openaitest.Request) openaitest.Reply {
		n := taskNumber(req.Body)
		mu.Lock()
		if n >= 0 && n < total {
			calls[n] = time.Now()
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			if n >= 0 && n < total {
				answers[n] = time.Now()
			}
			mu.Unlock()
		}()
		return openaitest.Reply{Content: openaitest.Success("fix the selector")}
	})
	srv := startModelMesh(b, model, nil, benchPolicy())
	var done atomic.Int64
	sub, err := srv.NC.Subscribe(events.StageFilter(events.StageSucceeded), func(m *nats.Msg) {
		id, _, _ := events.ParseTaskSubject(m.Subject)
		n, err := strconv.Atoi(strings.TrimPrefix(id, "o"))
		if err != nil || n >= total {
			return
		}
		now := time.Now()
		mu.Lock()
		recorded[n] = now
		mu.Unlock()
		done.Add(1)
	})
	if err != nil {
		b.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()
	_ = srv.NC.Flush()
	waitDone := func(n int) {
		deadline := time.Now().Add(5 * time.Minute)
		for done.Load() < int64(n) {
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d finished", done.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	submit := func(n int) { submitModelTask(b, srv, fmt.Sprintf("type_%d", n%8), fmt.Sprintf("o%d", n), n) }

	for n := range warm {
		submit(n)
	}
	waitDone(warm)
	start, satCPU := time.Now(), cpuTime()
	for n := warm; n < warm+burst; n++ {
		submit(n)
	}
	waitDone(warm + burst)
	saturation := float64(burst) / time.Since(start).Seconds()
	satCPUPerTask := float64((cpuTime() - satCPU).Microseconds()) / burst

	rate := saturation / 2
	interval := time.Duration(float64(time.Second) / rate)
	first := warm + burst
	intended := make([]time.Time, total)
	b.ResetTimer()
	cpu := cpuTime()
	t0 := time.Now()
	for i := range b.N {
		at := t0.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(at))
		intended[first+i] = at
		submit(first + i)
	}
	waitDone(total)
	b.StopTimer()
	cpuPerTask := float64((cpuTime() - cpu).Microseconds()) / float64(b.N)

	mu.Lock()
	defer mu.Unlock()
	var call, record, e2e []time.Duration
	for n := first; n < total; n++ {
		if calls[n].IsZero() || answers[n].IsZero() {
			b.Fatalf("task %d reached the model never (or more than once)", n)
		}
		call = append(call, calls[n].Sub(intended[n]))
		record = append(record, recorded[n].Sub(answers[n]))
		e2e = append(e2e, recorded[n].Sub(intended[n]))
	}
	for _, ds := range [][]time.Duration{call, record, e2e} {
		slices.Sort(ds)
	}
	b.ReportMetric(saturation, "sat-tasks/s")
	b.ReportMetric(satCPUPerTask, "sat-cpu-µs/task")
	b.ReportMetric(rate, "rate-tasks/s")
	b.ReportMetric(cpuPerTask, "cpu-µs/task")
	b.ReportMetric(percentile(call, 50), "call-p50-ms")
	b.ReportMetric(percentile(call, 99), "call-p99-ms")
	b.ReportMetric(percentile(record, 50), "record-p50-ms")
	b.ReportMetric(percentile(record, 99), "record-p99-ms")
	b.ReportMetric(percentile(e2e, 50), "e2e-p50-ms")
	b.ReportMetric(percentile(e2e, 99), "e2e-p99-ms")
}

// benchLog is the mesh's log in a benchmark: discarded, or written to the
// file DISPATCH_BENCH_LOG names (at debug level) to see why a run went as
// it did.
func benchLog(b testing.TB) *slog.Logger {
	path := os.Getenv("DISPATCH_BENCH_LOG")
	if path == "" {
		return quiet
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
