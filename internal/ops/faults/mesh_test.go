package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/faults"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Instances per service.
const instancesPerService = 2

// procMesh runs every service of the mesh as `dispatch <service>`
// processes, instancesPerService of each, each as its service's NATS user,
// and keeps them running: an instance that exits (killed, or on its own)
// is started again. It records every fault it causes.
type procMesh struct {
	t        *testing.T
	dispatch string
	env      func(user string, extra ...string) []string
	model    *model
	// restartDelay bounds how long a killed instance stays down.
	restartDelay time.Duration

	instances []*instance
	wg        sync.WaitGroup

	mu          sync.Mutex
	disruptions []faults.Disruption
	counts      map[string]int
	unplanned   []string // instances that exited on their own, with why
}

// instance is one service process, supervised.
type instance struct {
	name, service string
	mu            sync.Mutex
	proc          *proctest.Process
	planned       bool          // the current process's end is ours
	hold          chan struct{} // while set, a stopped process is not started again
	stopped       bool
}

func newProcMesh(t *testing.T, dispatch string, env func(string, ...string) []string, m *model) *procMesh {
	pm := &procMesh{t: t, dispatch: dispatch, env: env, model: m, restartDelay: 800 * time.Millisecond, counts: map[string]int{}}
	for _, svc := range mesh.All {
		for i := 1; i <= instancesPerService; i++ {
			pm.instances = append(pm.instances, &instance{name: fmt.Sprintf("%s-%d", svc, i), service: svc})
		}
	}
	return pm
}

// start starts every instance under supervision. The caller must defer
// stop: supervisors must end before the test's cleanups run.
func (pm *procMesh) start() {
	for _, in := range pm.instances {
		pm.wg.Add(1)
		go pm.supervise(in)
	}
}

func (pm *procMesh) supervise(in *instance) {
	defer pm.wg.Done()
	var extra []string
	if in.service == mesh.Executor {
		// The scripted model refuses the key of one task (plan A) and
		// takes it for the next: a refused key's mark, which would stop
		// every later call with it, ends at once here.
		extra = append(extra, "DISPATCH_OPENAI_BASE_URL="+pm.model.baseURL(in.name), "DISPATCH_MODEL_DEAD_FOR=1ns")
	}
	for {
		in.mu.Lock()
		if in.stopped {
			in.mu.Unlock()
			return
		}
		if hold := in.hold; hold != nil { // everything is stopped: wait for the word
			in.mu.Unlock()
			<-hold
			continue
		}
		p := proctest.Start(pm.t, in.name, pm.env(in.service, extra...), pm.dispatch, in.service)
		p.Quiet()
		in.proc, in.planned = p, false
		in.mu.Unlock()

		<-p.Done
		in.mu.Lock()
		planned, stopped := in.planned, in.stopped
		in.mu.Unlock()
		switch {
		case stopped:
			return
		case !planned && strings.Contains(p.Output(), "connect to NATS"):
			// Started while the server was down: like any supervisor, try again.
			pm.count("restarts refused (NATS down)")
			time.Sleep(500 * time.Millisecond)
		case !planned:
			pm.mu.Lock()
			pm.counts["unplanned exits"]++
			pm.unplanned = append(pm.unplanned, fmt.Sprintf("%s at %s (%v):\n%s",
				in.name, time.Now().Format(time.TimeOnly), p.Err, p.Tail(1500)))
			pm.mu.Unlock()
			time.Sleep(time.Second)
		default:
			time.Sleep(pm.restartDelay/4 + rand.N(pm.restartDelay*3/4))
		}
	}
}

func (pm *procMesh) count(kind string) {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	pm.counts[kind]++
}

// stop ends every instance with SIGTERM (SIGKILL after patience) and waits
// for the supervisors.
func (pm *procMesh) stop() {
	for _, in := range pm.instances {
		in.mu.Lock()
		in.stopped = true
		if in.hold != nil {
			close(in.hold)
			in.hold = nil
		}
		if p := in.proc; p != nil && !p.Exited() {
			_ = p.Signal(syscall.SIGTERM)
		}
		in.mu.Unlock()
	}
	done := make(chan struct{})
	go func() { pm.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(patience):
		for _, in := range pm.instances {
			in.mu.Lock()
			if p := in.proc; p != nil {
				_ = p.Signal(syscall.SIGKILL)
			}
			in.mu.Unlock()
		}
		<-done
	}
}

// record notes a fault.
func (pm *procMesh) record(kind, instance string) {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	pm.counts[kind]++
	pm.disruptions = append(pm.disruptions, faults.Disruption{What: kind, Instance: instance, At: time.Now()})
}

// byName is the instance called name.
func (pm *procMesh) byName(name string) *instance {
	for _, in := range pm.instances {
		if in.name == name {
			return in
		}
	}
	return nil
}

// logProblems logs the warnings and errors of every running instance's
// output (its last 64 KiB): what a mesh that does not come to rest was
// doing, where the instances are otherwise quiet.
func (pm *procMesh) logProblems(t *testing.T) {
	for _, in := range pm.instances {
		in.mu.Lock()
		p := in.proc
		in.mu.Unlock()
		if p == nil {
			continue
		}
		var lines []string
		for line := range strings.Lines(p.Tail(64 << 10)) {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				lines = append(lines, line)
			}
		}
		if len(lines) > 0 {
			t.Logf("--- %s, warnings and errors (last %d):\n%s", in.name, min(len(lines), 40), strings.Join(lines[max(0, len(lines)-40):], ""))
		}
	}
}

// of returns the instances of service.
func (pm *procMesh) of(service string) []*instance {
	var out []*instance
	for _, in := range pm.instances {
		if service == "" || in.service == service {
			out = append(out, in)
		}
	}
	return out
}

// kill SIGKILLs the running process of in; false when it was not running.
func (pm *procMesh) kill(in *instance, kind string) bool {
	in.mu.Lock()
	p := in.proc
	if p == nil || p.Exited() || in.stopped || in.planned {
		in.mu.Unlock()
		return false
	}
	in.planned = true
	in.mu.Unlock()
	pm.record(kind, in.name) // before the signal: anything it cuts short comes after
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return false
	}
	return true
}

// killRandom kills a random running instance of service ("" any),
// waiting (up to patience) for one to be running.
func (pm *procMesh) killRandom(service, kind string) bool {
	ins := pm.of(service)
	deadline := time.Now().Add(patience)
	for time.Now().Before(deadline) {
		for _, i := range rand.Perm(len(ins)) {
			if pm.kill(ins[i], kind) {
				return true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// Kill kinds, as the report counts them.
const (
	killRandom       = "kill: random instance"
	killMidCall      = "kill: executor mid-call"
	killAfterAnswer  = "kill: executor between answer and publish"
	killAfterHistory = "kill: recorders after a history write"
)

// killAimed kills what a trigger names: arm sets the trigger, which calls
// back once with the instance to kill ("" for every instance of service).
// Without a trigger within a few seconds a random instance of service is
// killed instead.
func (pm *procMesh) killAimed(kind, service string, arm func(func(string)), disarm func()) {
	fired := make(chan int, 1)
	arm(func(name string) {
		targets := pm.of(service)
		if in := pm.byName(name); in != nil {
			targets = []*instance{in}
		}
		n := 0
		for _, in := range targets {
			if pm.kill(in, kind) {
				n++
			}
		}
		fired <- n
	})
	select {
	case n := <-fired:
		if n > 0 {
			return
		}
	case <-time.After(5 * time.Second):
		disarm()
	}
	pm.killRandom(service, kind+" (no trigger: random)")
}

// terminateAll SIGTERMs every instance at once, with also (when set) the
// nats-server, waits for all to exit, then starts everything again. It
// returns the instances that did not exit cleanly (status 0), with why.
func (pm *procMesh) terminateAll(server *proctest.NATS) []string {
	pm.t.Helper()
	pm.record("SIGTERM of everything", "")
	var procs []*proctest.Process
	var holds []chan struct{}
	for _, in := range pm.instances {
		in.mu.Lock()
		hold := make(chan struct{})
		killed := in.planned // and not started again yet
		in.hold, in.planned = hold, true
		holds = append(holds, hold)
		if p := in.proc; p != nil && !p.Exited() && !killed {
			procs = append(procs, p)
			_ = p.Signal(syscall.SIGTERM)
		}
		in.mu.Unlock()
	}
	if server != nil {
		server.Stop(pm.t, syscall.SIGTERM)
	}
	var unclean []string
	for _, p := range procs {
		select {
		case <-p.Done:
			if p.Err != nil {
				unclean = append(unclean, fmt.Sprintf("%s: %v\n%s", p.Name, p.Err, p.Tail(1500)))
			}
		case <-time.After(patience):
			pm.t.Fatalf("%s did not exit within %s of SIGTERM:\n%s", p.Name, patience, p.Tail(3000))
		}
	}
	if server != nil {
		server.Start(pm.t)
	}
	for i, in := range pm.instances {
		in.mu.Lock()
		if in.hold == holds[i] {
			in.hold = nil
		}
		in.mu.Unlock()
		close(holds[i])
	}
	return unclean
}

// watchHistory calls the armed hook (once) on the next write to the history
// bucket ($KV.dispatch_history.>), until ctx ends. The watch is opened
// again if it stops (a server restart).
//
// The hook is "kill the recorders right after one wrote a store": a
// recorder killed between its store writes and its publishes and ack,
// whose attempt is redelivered to a recorder that finds it half recorded.
// Recorders no longer write the trust bucket (a type's outcomes are
// messages on the outcome stream); their last store write before they
// publish is the subject's history, appended in the handler after the
// task state. So the history bucket is watched, not the outcome stream
// (dispatch.outcome.>), which a recorder publishes to right before its
// next event and its ack, when there is little left to cut short. (The
// name is the hook's first one: the trust bucket's.)
func watchHistory(ctx context.Context, js jetstream.JetStream, hook *hookSlot) {
	for ctx.Err() == nil {
		kv, err := js.KeyValue(ctx, services.BucketHistory)
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for e := range w.Updates() {
			if e != nil {
				hook.fire("")
			}
		}
		_ = w.Stop()
	}
}

// hookSlot holds a callback that fires once.
type hookSlot struct {
	mu sync.Mutex
	f  func(string)
}

func (h *hookSlot) arm(f func(string)) { h.mu.Lock(); h.f = f; h.mu.Unlock() }
func (h *hookSlot) disarm()            { h.arm(nil) }
func (h *hookSlot) fire(arg string) {
	h.mu.Lock()
	f := h.f
	h.f = nil
	h.mu.Unlock()
	if f != nil {
		f(arg)
	}
}

// connect opens a connection as user that reconnects forever.
func connect(t *testing.T, url, user, password string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(user, password), nats.CustomInboxPrefix("_INBOX."+user),
		nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.Name("faults-"+user),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // a watch lost with the server is opened again
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// summary lists up to n items, with how many were left out.
func summary(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, "\n")
	}
	return strings.Join(items[:n], "\n") + fmt.Sprintf("\n… and %d more", len(items)-n)
}
