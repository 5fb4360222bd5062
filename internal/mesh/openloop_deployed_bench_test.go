package mesh_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
)

// BenchmarkOpenLoopDeployed is BenchmarkOpenLoop with the mesh as it is
// deployed, in processes of their own, so that each process's pauses are
// its own garbage collector's:
//
//   - nats-server, the real binary built from the module (proctest.Build,
//     as the fault suite builds it), loaded with deploy/nats/single.conf
//     and users.conf on loopback, without the tls block as the fault suite
//     runs it (DISPATCH_BENCH_TLS=1: with it, every connection TLS, as
//     shipped);
//   - the mesh: every service of mesh.All as `dispatch <service>`, one
//     process each under its own NATS user, the state writers and the
//     executor sharing DISPATCH_STATE_KEY, as deploy/k8s and the fault
//     suite run them; `dispatch provision` (as admin) seeds the policy of
//     BenchmarkOpenLoop: every type exempt, no canaries;
//   - this process: the load generator, as the admin user (it publishes
//     on dispatch.submit.<type> and follows dispatch.task.*.succeeded with
//     a core subscription), and the scripted model the executor calls over
//     HTTP.
//
// The model lives with the load generator because both ends of each
// latency are read here, on one monotonic clock: `call` runs from a task's
// intended send time to the model receiving its call, `record` from the
// model answering to the follower receiving `succeeded`. It stands for a
// model on another machine: its CPU is not the mesh's, and a pause here
// can only lengthen a latency, never hide one.
//
// The run is BenchmarkOpenLoop's: warm (500 tasks), saturation (2,000 at
// once over 8 types and 1,000 subjects, tasks/s until the last is
// recorded), then the benchmark's tasks at half that rate on a fixed
// schedule (no coordinated omission: every latency counts from the
// intended send time). Besides p50 and p99 of `call`, `record` and `e2e`
// it reports the CPU time per task of each kind of process (nats-server,
// the mesh's seven, this one: /proc/<pid>/stat and getrusage) and the
// cores they kept busy, beside the cores the whole machine had busy
// (/proc/stat, other work included), at saturation (`sat-`) and at the
// rate: where 2 shared cores bound the latency, the figures show it. Each
// process's CPU time per task and peak RSS are logged. The processes
// inherit GOGC and GOMAXPROCS from the environment. DISPATCH_BENCH_LOAD
// sets the share of saturation to run at (default 0.5): a lower one shows
// what the path costs when the cores are not the bound.
//
//	go test -run '^$' -bench OpenLoopDeployed -benchtime 2000x -count 3 ./internal/mesh/
//	DISPATCH_BENCH_LOAD=0.25 go test -run '^$' -bench OpenLoopDeployed -benchtime 2000x ./internal/mesh/
func BenchmarkOpenLoopDeployed(b *testing.B) {
	const warm, burst = 500, 2000
	st := &stamps{tasks: map[int]*taskTimes{}}
	model := openaitest.New(b, func(_ int, req openaitest.Request) openaitest.Reply {
		n := taskNumber(req.Body)
		st.called(n)
		defer st.answered(n)
		return openaitest.Reply{Content: openaitest.Success("fix the selector")}
	})
	d := startDeployed(b, model.BaseURL())
	st.follow(b, d.follower)
	submit := func(n int) {
		if _, err := d.js.PublishAsync(events.SubmitSubject(fmt.Sprintf("type_%d", n%8)), modelTask(fmt.Sprintf("o%d", n), n)); err != nil {
			b.Fatal(err)
		}
	}

	for n := range warm {
		submit(n)
	}
	d.waitRecorded(b, st, warm)

	before := d.usage(b)
	for n := warm; n < warm+burst; n++ {
		submit(n)
	}
	d.waitRecorded(b, st, warm+burst)
	sat := d.usage(b).since(before)
	saturation := float64(burst) / sat.wall.Seconds()

	rate := saturation * loadShare(b)
	interval := time.Duration(float64(time.Second) / rate)
	first, sent := warm+burst, 0
	before = d.usage(b)
	t0 := time.Now()
	for b.Loop() {
		at := t0.Add(time.Duration(sent) * interval)
		time.Sleep(time.Until(at))
		st.intend(first+sent, at)
		submit(first + sent)
		sent++
	}
	d.waitRecorded(b, st, first+sent)
	run := d.usage(b).since(before)

	call, record, e2e, repeated := st.latencies(b, first, first+sent)
	if repeated > 0 {
		b.Logf("%d tasks reached the model more than once (the first call counts)", repeated)
	}
	b.ReportMetric(saturation, "sat-tasks/s")
	b.ReportMetric(sat.perTask(sat.ours(), burst), "sat-cpu-µs/task")
	b.ReportMetric(sat.cores(sat.ours()), "sat-cores")
	b.ReportMetric(sat.cores(sat.machine), "sat-machine-cores")
	b.ReportMetric(rate, "rate-tasks/s")
	b.ReportMetric(run.perTask(run.ours(), sent), "cpu-µs/task")
	b.ReportMetric(run.perTask(run.of(natsProc), sent), "nats-cpu-µs/task")
	b.ReportMetric(run.perTask(run.of(mesh.All...), sent), "mesh-cpu-µs/task")
	b.ReportMetric(run.perTask(run.of(loadProc), sent), "load-cpu-µs/task")
	b.ReportMetric(run.cores(run.ours()), "cores")
	b.ReportMetric(run.cores(run.machine), "machine-cores")
	b.ReportMetric(percentile(call, 50), "call-p50-ms")
	b.ReportMetric(percentile(call, 99), "call-p99-ms")
	b.ReportMetric(percentile(record, 50), "record-p50-ms")
	b.ReportMetric(percentile(record, 99), "record-p99-ms")
	b.ReportMetric(percentile(e2e, 50), "e2e-p50-ms")
	b.ReportMetric(percentile(e2e, 99), "e2e-p99-ms")
	b.Logf("CPU µs per task at saturation (%.0f tasks/s): %s", saturation, sat.byProcess(burst))
	b.Logf("CPU µs per task at %.0f tasks/s: %s", rate, run.byProcess(sent))
	b.Logf("peak RSS: %s", d.peakRSS())
}

// The processes of BenchmarkOpenLoopDeployed besides the services, by name.
const (
	natsProc = "nats-server"
	loadProc = "load" // this process: load generator and model
)

// deployed is a mesh of processes: nats-server and one `dispatch
// <service>` per service, and this process's connections to it.
type deployed struct {
	procs    map[string]*proctest.Process // by name: natsProc and each service
	js       jetstream.JetStream          // submits
	follower *nats.Conn                   // follows the outcomes
}

// startDeployed builds and starts nats-server, provisions as admin and
// starts every service as its user, the executor calling modelURL.
func startDeployed(b *testing.B, modelURL string) *deployed {
	b.Helper()
	natsBin, dispatch := proctest.Build(b)
	pw := proctest.SetPasswords(b)
	natsDir := filepath.Join(proctest.Root(b), "deploy", "nats")
	withTLS := os.Getenv("DISPATCH_BENCH_TLS") != ""
	var srv *proctest.NATS
	if withTLS {
		srv = proctest.StartNATSTLS(b, natsBin, natsDir, 0, "")
	} else {
		srv = proctest.StartNATS(b, natsBin, natsDir, 0)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		b.Fatal(err)
	}
	env := func(user string, more ...string) []string {
		vars := []string{"DISPATCH_NATS_URL=" + srv.URL, "DISPATCH_NATS_USER=" + user, "DISPATCH_NATS_PASSWORD=" + pw[user], "DISPATCH_LOG_LEVEL=warn"}
		if withTLS {
			vars = append(vars, "DISPATCH_NATS_CA="+srv.CA)
		}
		if slices.Contains([]string{mesh.Intake, mesh.Verifier, mesh.Recorder, mesh.Executor}, user) {
			vars = append(vars, "DISPATCH_STATE_KEY="+base64.StdEncoding.EncodeToString(key))
		}
		if user == mesh.Executor {
			vars = append(vars, "DISPATCH_OPENAI_BASE_URL="+modelURL, "DISPATCH_OPENAI_API_KEY=test")
		}
		return proctest.Env(append(vars, more...)...)
	}
	connect := func(name string) *nats.Conn {
		opts := []nats.Option{nats.UserInfo("admin", pw["admin"]), nats.Name(name)}
		if withTLS {
			opts = append(opts, nats.RootCAs(srv.CA))
		}
		nc, err := nats.Connect(srv.URL, opts...)
		if err != nil {
			b.Fatalf("connect as admin: %v", err)
		}
		b.Cleanup(nc.Close)
		return nc
	}

	d := &deployed{procs: map[string]*proctest.Process{natsProc: srv.Proc}, follower: connect("openloop-follow")}
	js, err := jetstream.New(connect("openloop-submit"))
	if err != nil {
		b.Fatal(err)
	}
	d.js = js
	proctest.WaitFor(b, patience, "JetStream", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err
	})
	policyFile := filepath.Join(b.TempDir(), "policy.json")
	if err := os.WriteFile(policyFile, []byte(`{"defaults": {"exempt": true, "canary": 0}}`), 0o600); err != nil {
		b.Fatal(err)
	}
	proctest.RunToEnd(b, patience, "provision", env("admin", "DISPATCH_POLICY_FILE="+policyFile), dispatch, "provision")
	for _, name := range mesh.All {
		d.procs[name] = proctest.Start(b, name, env(name), dispatch, name)
	}
	return d
}

// waitRecorded waits until n tasks are recorded, failing when a process
// exits meanwhile.
func (d *deployed) waitRecorded(b *testing.B, st *stamps, n int) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for st.recorded.Load() < int64(n) {
		proctest.CheckRunning(b, d.procs)
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d tasks recorded", st.recorded.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// usage is the CPU time each process of the run has used, and the busy
// time of the whole machine, at one moment.
type usage struct {
	at      time.Time
	cpu     map[string]time.Duration // by process name, loadProc included
	machine time.Duration            // every core's busy time, whoever used it
}

// clockTick is the unit of the CPU times of /proc (USER_HZ: 100 on Linux).
const clockTick = 10 * time.Millisecond

func (d *deployed) usage(b *testing.B) usage {
	b.Helper()
	u := usage{at: time.Now(), cpu: map[string]time.Duration{loadProc: cpuTime()}}
	for name, p := range d.procs {
		t, err := procCPU(p.Pid())
		if err != nil {
			proctest.CheckRunning(b, d.procs)
			b.Fatalf("CPU time of %s: %v", name, err)
		}
		u.cpu[name] = t
	}
	m, err := machineBusy()
	if err != nil {
		b.Fatalf("the machine's busy time: %v", err)
	}
	u.machine = m
	return u
}

// since is what was used from earlier to u.
func (u usage) since(earlier usage) spent {
	s := spent{wall: u.at.Sub(earlier.at), cpu: map[string]time.Duration{}, machine: u.machine - earlier.machine}
	for name, t := range u.cpu {
		s.cpu[name] = t - earlier.cpu[name]
	}
	return s
}

// spent is the CPU time used over a phase of wall time.
type spent struct {
	wall    time.Duration
	cpu     map[string]time.Duration
	machine time.Duration
}

// of is the CPU time of the named processes together.
func (s spent) of(names ...string) time.Duration {
	var t time.Duration
	for _, n := range names {
		t += s.cpu[n]
	}
	return t
}

// ours is the CPU time of every process of the run.
func (s spent) ours() time.Duration {
	var t time.Duration
	for _, c := range s.cpu {
		t += c
	}
	return t
}

func (s spent) perTask(t time.Duration, tasks int) float64 {
	return float64(t.Microseconds()) / float64(tasks)
}

// cores is how many cores t kept busy over the phase.
func (s spent) cores(t time.Duration) float64 { return t.Seconds() / s.wall.Seconds() }

// byProcess lists every process's CPU µs per task, nats-server first,
// then the services in mesh order, then this process, then the machine's
// cores busy against ours.
func (s spent) byProcess(tasks int) string {
	var parts []string
	for _, name := range slices.Concat([]string{natsProc}, mesh.All, []string{loadProc}) {
		parts = append(parts, fmt.Sprintf("%s %.0f", name, s.perTask(s.cpu[name], tasks)))
	}
	return fmt.Sprintf("%s; cores busy: ours %.2f, the machine's %.2f", strings.Join(parts, ", "), s.cores(s.ours()), s.cores(s.machine))
}

// peakRSS lists every child process's VmHWM.
func (d *deployed) peakRSS() string {
	var parts []string
	for _, name := range slices.Concat([]string{natsProc}, mesh.All) {
		parts = append(parts, fmt.Sprintf("%s %s", name, procHWM(d.procs[name].Pid())))
	}
	return strings.Join(parts, ", ")
}

// procCPU is the user and system CPU time process pid has used
// (/proc/<pid>/stat: utime and stime, fields 14 and 15, every thread).
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')') // the command name, in parentheses, may hold anything
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	f := strings.Fields(string(data[i+1:])) // from field 3 on
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// machineBusy is the time every core of the machine has spent on anything
// but idling (the cpu line of /proc/stat: all but idle and iowait).
func machineBusy() (time.Duration, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat begins %q", line)
	}
	var busy int64
	for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal (guest is in user)
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return time.Duration(busy) * clockTick, nil
}

// procHWM is process pid's peak RSS (VmHWM), as /proc/<pid>/status gives it.
func procHWM(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "?"
}

// stamps are the times of each task of an open-loop run, by its number:
// when it was to be sent, when the model got its call and answered it,
// when its `succeeded` arrived.
type stamps struct {
	mu       sync.Mutex
	tasks    map[int]*taskTimes
	recorded atomic.Int64
}

type taskTimes struct {
	intended, call, answer, recorded time.Time
	calls                            int
}

// of is task n's times; st.mu is held.
func (st *stamps) of(n int) *taskTimes {
	t := st.tasks[n]
	if t == nil {
		t = &taskTimes{}
		st.tasks[n] = t
	}
	return t
}

func (st *stamps) intend(n int, at time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.of(n).intended = at
}

func (st *stamps) called(n int) {
	now := time.Now()
	if n < 0 {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	t := st.of(n)
	if t.calls++; t.calls == 1 {
		t.call = now
	}
}

func (st *stamps) answered(n int) {
	now := time.Now()
	if n < 0 {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if t := st.of(n); t.answer.IsZero() {
		t.answer = now
	}
}

// follow stamps every task's `succeeded` as nc receives it.
func (st *stamps) follow(b *testing.B, nc *nats.Conn) {
	b.Helper()
	sub, err := nc.Subscribe(events.StageFilter(events.StageSucceeded), func(m *nats.Msg) {
		now := time.Now()
		id, _, _ := events.ParseTaskSubject(m.Subject)
		n, err := strconv.Atoi(strings.TrimPrefix(id, "o"))
		if err != nil {
			return
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		if t := st.of(n); t.recorded.IsZero() {
			t.recorded = now
			st.recorded.Add(1)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
}

// latencies are the sorted `call`, `record` and `e2e` of tasks [from, to),
// and how many of them reached the model more than once.
func (st *stamps) latencies(b *testing.B, from, to int) (call, record, e2e []time.Duration, repeated int) {
	b.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	var missing []error
	for n := from; n < to; n++ {
		t := st.of(n)
		if t.call.IsZero() || t.answer.IsZero() || t.recorded.IsZero() {
			missing = append(missing, fmt.Errorf("task %d: call %v, answer %v, recorded %v", n, !t.call.IsZero(), !t.answer.IsZero(), !t.recorded.IsZero()))
			continue
		}
		if t.calls > 1 {
			repeated++
		}
		call = append(call, t.call.Sub(t.intended))
		record = append(record, t.recorded.Sub(t.answer))
		e2e = append(e2e, t.recorded.Sub(t.intended))
	}
	if len(missing) > 0 {
		b.Fatalf("%d tasks lack a time: %v", len(missing), errors.Join(missing[:min(5, len(missing))]...))
	}
	for _, ds := range [][]time.Duration{call, record, e2e} {
		slices.Sort(ds)
	}
	return call, record, e2e, repeated
}

// loadShare is the share of saturation the open-loop run keeps:
// DISPATCH_BENCH_LOAD, 0.5 unset.
func loadShare(b *testing.B) float64 {
	v := os.Getenv("DISPATCH_BENCH_LOAD")
	if v == "" {
		return 0.5
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 1 {
		b.Fatalf("DISPATCH_BENCH_LOAD=%q: want a share of saturation in (0, 1]", v)
	}
	return f
}
