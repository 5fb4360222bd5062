package faults_test

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/faults"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

var long = flag.Bool("faults.long", false, "run the long fault suite (100 kills; also DISPATCH_FAULTS=long)")

// patience bounds every wait for a process or the mesh. It is a deadlock
// guard, not a timing assertion.
const patience = 60 * time.Second

// ackWait and grace are short so that a killed worker's messages come back
// and a SIGTERM'd one drains within the test's time. The recorders keep
// the default AckWait (30s), as in production: an outcome redelivered after
// a recorder crash comes back after many newer outcomes of its type.
const (
	ackWait         = 2 * time.Second
	recorderAckWait = 30 * time.Second
	grace           = 3 * time.Second
	// slack is how long before a model call a fault may have happened and
	// still explain why the call was repeated or cut short: an outage (a
	// server restart, SIGTERM of everything) lasts a few seconds, and a
	// killed executor's message comes back after ackWait.
	slack = 10 * time.Second
)

// suite sizes one mode of the fault suite.
type suite struct {
	name string
	// tasks are submitted at a steady pace over load, while the faults
	// happen.
	tasks int
	load  time.Duration
	// kills SIGKILL one instance each, spread over the load: random ones
	// and aimed ones in turn (killKinds).
	kills int
	// restarts are nats-server restarts, by signal; terminations SIGTERM
	// everything (every instance and nats-server) at once.
	restarts     []syscall.Signal
	terminations int
	// The cluster run: its tasks, load, kills and stream leaders shut down.
	clusterTasks, clusterKills, leaderShutdowns int
	clusterLoad                                 time.Duration
	// drain bounds the wait for every task to end after the load.
	drain time.Duration
}

func mode() suite {
	if *long || os.Getenv("DISPATCH_FAULTS") == "long" {
		return suite{name: "long", tasks: 1500, load: 5 * time.Minute, kills: 100,
			restarts: []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}, terminations: 2,
			clusterTasks: 500, clusterKills: 20, leaderShutdowns: 3, clusterLoad: 100 * time.Second,
			drain: 5 * time.Minute}
	}
	return suite{name: "default", tasks: 250, load: 40 * time.Second, kills: 25,
		restarts: []syscall.Signal{syscall.SIGTERM}, terminations: 1,
		clusterTasks: 120, clusterKills: 5, leaderShutdowns: 1, clusterLoad: 25 * time.Second,
		drain: 3 * time.Minute}
}

// killKinds are the kills in turn: two random ones, then aimed ones: an
// executor mid-call, an executor between the model's answer and its
// publish, and every recorder right after one of them wrote a history record
// (before it acked the outcome).
var killKinds = []string{killRandom, killMidCall, killRandom, killAfterAnswer, killAfterHistory}

// run is one fault run: a mesh of processes, the model, the load.
type run struct {
	t          *testing.T
	s          suite
	pm         *procMesh
	model      *model
	work       *workload
	admin      jetstream.JetStream
	client     *client.Client // the client user: submits through the API
	policy     *policy.Source
	historyHit *hookSlot
}

// fault is something done to the mesh at a point of the load.
type fault struct {
	at time.Duration
	do func()
}

// kills spreads n kills over the load, their kinds in turn.
func (r *run) kills(n int, over time.Duration) []fault {
	var fs []fault
	for k := range n {
		kind := killKinds[k%len(killKinds)]
		fs = append(fs, fault{at: over * time.Duration(k+1) / time.Duration(n+1), do: func() { r.kill(kind) }})
	}
	return fs
}

func (r *run) kill(kind string) {
	switch kind {
	case killMidCall:
		r.pm.killAimed(kind, mesh.Executor, r.model.armMidCall, r.model.disarm)
	case killAfterAnswer:
		r.pm.killAimed(kind, mesh.Executor, r.model.armAfterAnswer, r.model.disarm)
	case killAfterHistory:
		r.pm.killAimed(kind, mesh.Recorder, r.historyHit.arm, r.historyHit.disarm)
	default:
		r.pm.killRandom("", kind)
	}
}

// unsettled reports whether err is a JetStream request that found no server
// to answer it (no responders, a timeout, a fetch without heartbeats) while
// ctx still has time: the checks read again.
func unsettled(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, context.DeadlineExceeded)
}

// drive submits the workload while causing the faults in order, waits for
// every task to end and the mesh to be idle, then checks the stores.
func (r *run) drive(ctx context.Context, load time.Duration, kills int, fs []fault) {
	t := r.t
	slices.SortStableFunc(fs, func(a, b fault) int { return int(a.at - b.at) })
	start := time.Now()
	sub := submit(ctx, r.client, r.work, load)
	for _, f := range fs {
		if wait := time.Until(start.Add(f.at)); wait > 0 {
			time.Sleep(wait)
		}
		f.do()
	}
	tasks := sub.wait(t)
	t.Logf("%d tasks submitted in %s with %d faults", len(tasks), time.Since(start).Round(time.Second), len(fs))

	ends := waitEnded(t, r.admin, tasks, r.s.drain)
	idle := waitIdle(t, r.admin, patience)
	t.Logf("mesh idle %s after the load (%d of %d tasks ended; idle %v)",
		time.Since(start.Add(load)).Round(time.Second), ends, len(tasks), idle)
	if !idle { // the services' logs are quiet: say what the busy ones said
		r.pm.logProblems(t)
	}

	r.pm.mu.Lock()
	in := faults.Input{
		JS: r.admin, Policy: r.policy, Tasks: tasks, Calls: r.model.ledger,
		Disruptions: slices.Clone(r.pm.disruptions), Slack: slack, Faults: maps.Clone(r.pm.counts),
	}
	unplanned := slices.Clone(r.pm.unplanned)
	r.pm.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := faults.Check(cctx, in)
	for err != nil && unsettled(cctx, err) {
		// A cluster whose leaders the faults moved may still be electing
		// one: the stores are there, a request found nobody to answer it.
		t.Logf("check: %v; trying again", err)
		time.Sleep(time.Second)
		rep, err = faults.Check(cctx, in)
	}
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	t.Logf("fault suite (%s):\n%s", r.s.name, rep)
	if len(unplanned) > 0 {
		t.Logf("%d instances exited on their own (each was started again):\n%s", len(unplanned), summary(unplanned, 5))
	}
	if rep.Kills < kills {
		t.Errorf("%d kills, want %d", rep.Kills, kills)
	}
	r.checkVerified(cctx, tasks)
	if !rep.OK() {
		byKind := map[string][]string{}
		var kinds []string
		for _, p := range rep.Problems {
			if byKind[p.Kind] == nil {
				kinds = append(kinds, p.Kind)
			}
			byKind[p.Kind] = append(byKind[p.Kind], p.String())
		}
		for _, kind := range kinds {
			t.Errorf("%d %s problems:\n%s", len(byKind[kind]), kind, summary(byKind[kind], 10))
		}
	}
}

// checkVerified proves the verifier had real work under the faults: its
// durable delivered at least one message (the queued event) for every task
// of verifiedType — a type without a verifier never reaches it.
func (r *run) checkVerified(ctx context.Context, tasks map[string]faults.Plan) {
	t := r.t
	want := 0
	for _, tk := range r.work.tasks {
		if _, ok := tasks[tk.id]; ok && tk.typ == verifiedType {
			want++
		}
	}
	cons, err := r.admin.Consumer(ctx, services.Stream, services.ConsumerVerifier)
	if err != nil {
		t.Errorf("consumer %s: %v", services.ConsumerVerifier, err)
		return
	}
	got := cons.CachedInfo().Delivered.Consumer
	t.Logf("the verifier delivered %d messages for the %d tasks of %s", got, want, verifiedType)
	if got < uint64(want) {
		t.Errorf("the verifier delivered %d messages, want at least %d (one per task of %s)", got, want, verifiedType)
	}
}

// The real binaries as separate processes, two instances of each service,
// each as its own NATS user, against nats-server: SIGKILLs of random
// instances and aimed ones under load, a nats-server restart, SIGTERM of
// everything; then every invariant of faults.Check holds.
func TestFaultProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault suite runs the whole mesh as processes")
	}
	s := mode()
	natsBin, dispatch := proctest.Build(t)
	pw := proctest.SetPasswords(t)
	srv := proctest.StartNATS(t, natsBin, natsDir(t), proctest.FreePorts(t, 1)[0])
	srv.Proc.Quiet()
	r := newRun(t, s, "p", s.tasks, dispatch, srv.URL, pw, nil)
	defer r.pm.stop()

	fs := r.kills(s.kills, s.load)
	for i, sig := range s.restarts {
		fs = append(fs, fault{at: s.load * time.Duration(2*i+1) / time.Duration(2*len(s.restarts)+1), do: func() {
			r.pm.record(fmt.Sprintf("nats-server restart (%v)", sig), "")
			srv.Restart(t, sig)
			srv.Proc.Quiet()
		}})
	}
	for i := range s.terminations {
		fs = append(fs, fault{at: s.load * time.Duration(2*i+2) / time.Duration(2*s.terminations+1), do: func() {
			unclean := r.pm.terminateAll(srv)
			srv.Proc.Quiet()
			if len(unclean) > 0 {
				t.Logf("SIGTERM: %d processes did not exit cleanly:\n%s", len(unclean), summary(unclean, 3))
			}
		}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchHistory(ctx, r.admin, r.historyHit)
	r.drive(ctx, s.load, s.kills, fs)
}

// The same on a 3-node JetStream cluster (in-process servers from
// deploy/nats/cluster) with the stream and buckets R3, the services as
// processes connected to all three nodes: the stream leader is shut down
// mid-load (and started again), with a few kills.
func TestFaultCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault suite runs the whole mesh as processes")
	}
	s := mode()
	_, dispatch := proctest.Build(t)
	pw := proctest.SetPasswords(t)
	clientPorts, routePorts := proctest.FreePorts(t, 3), proctest.FreePorts(t, 3)
	nodes := make([]*server.Server, 3)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	startNode := func(i int) {
		ns, err := server.NewServer(proctest.ClusterNode(t, natsDir(t), i+1, clientPorts[i], routePorts, dirs[i]))
		if err != nil {
			t.Fatalf("node %d: %v", i+1, err)
		}
		ns.Start()
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		if !ns.ReadyForConnections(20 * time.Second) {
			t.Fatalf("node %d not ready", i+1)
		}
		nodes[i] = ns
	}
	var urls []string
	for i := range nodes {
		startNode(i)
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i]))
	}
	r := newRun(t, s, "c", s.clusterTasks, dispatch, strings.Join(urls, ","), pw, []string{"DISPATCH_REPLICAS=3"})
	defer r.pm.stop()

	fs := r.kills(s.clusterKills, s.clusterLoad)
	for i := range s.leaderShutdowns {
		at := s.clusterLoad * time.Duration(2*i+1) / time.Duration(2*s.leaderShutdowns+1)
		fs = append(fs, fault{at: at, do: func() {
			leader := streamLeader(t, r.admin)
			for j, ns := range nodes {
				if ns.Name() != leader {
					continue
				}
				r.pm.record("stream leader shut down ("+leader+")", "")
				ns.Shutdown()
				ns.WaitForShutdown()
				time.Sleep(5 * time.Second) // the cluster goes on with two nodes
				startNode(j)
				r.pm.record("node started again ("+leader+")", "")
			}
		}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchHistory(ctx, r.admin, r.historyHit)
	r.drive(ctx, s.clusterLoad, s.clusterKills, fs)
}

// stateKey is the fault suite's DISPATCH_STATE_KEY (32 bytes, base64).
var stateKey = base64.StdEncoding.EncodeToString([]byte("the fault suite's state key, 32b"))

// newRun starts the model, provisions (as admin) and starts the mesh of
// processes against url.
func newRun(t *testing.T, s suite, prefix string, tasks int, dispatch, url string, pw map[string]string, extra []string) *run {
	t.Helper()
	r := &run{t: t, s: s, work: newWorkload(prefix, tasks, uint64(tasks)), historyHit: &hookSlot{}}
	r.model = startModel(t, r.work.plan, 100*time.Millisecond, 400*time.Millisecond)
	policyFile, pol := writePolicy(t)
	r.policy = pol
	env := func(user string, more ...string) []string {
		vars := []string{
			"DISPATCH_NATS_URL=" + url, "DISPATCH_NATS_USER=" + user, "DISPATCH_NATS_PASSWORD=" + pw[user],
			"DISPATCH_POLICY_FILE=" + policyFile, "DISPATCH_OPENAI_API_KEY=faults",
			"DISPATCH_ACK_WAIT=" + ackWait.String(), "DISPATCH_GRACE=" + grace.String(),
		}
		if user == mesh.Recorder {
			vars = append(vars, "DISPATCH_ACK_WAIT="+recorderAckWait.String())
		}
		// The state writers seal what they wrote, the executors start
		// from it (as deploy/ configures them): kills hit sealed and
		// stale seals alike.
		if slices.Contains([]string{mesh.Intake, mesh.Verifier, mesh.Recorder, mesh.Executor}, user) {
			vars = append(vars, "DISPATCH_STATE_KEY="+stateKey)
		}
		return proctest.Env(slices.Concat(vars, extra, more)...)
	}
	// The cluster elects its meta leader once the routes are up: provision
	// until it answers.
	proctest.WaitFor(t, patience, "dispatch provision", func() error {
		p := proctest.Start(t, "provision", env("admin"), dispatch, "provision")
		p.Quiet() // a failure is retried, and reported if it stays
		<-p.Done
		if p.Err != nil {
			return fmt.Errorf("%v: %s", p.Err, p.Tail(500))
		}
		return nil
	})
	_, r.admin = connect(t, url, "admin", pw["admin"])
	cnc, _ := connect(t, url, "client", pw["client"])
	cl, err := client.New(cnc, client.WithRequestTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r.client = cl
	r.pm = newProcMesh(t, dispatch, env, r.model)
	r.pm.start()
	return r
}

func natsDir(t *testing.T) string { return filepath.Join(proctest.Root(t), "deploy", "nats") }

// streamLeader is the name of the server leading the DISPATCH stream.
func streamLeader(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	var leader string
	proctest.WaitFor(t, patience, "the stream leader", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, services.Stream)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return errors.New("no leader")
		}
		leader = info.Cluster.Leader
		return nil
	})
	return leader
}

// waitEnded waits (up to drain) until every task has a terminal record on
// the stream and returns how many have.
func waitEnded(t *testing.T, js jetstream.JetStream, tasks map[string]faults.Plan, drain time.Duration) int {
	t.Helper()
	ended := map[string]bool{}
	next := uint64(1)
	deadline := time.Now().Add(drain)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := readEndings(ctx, js, &next, ended)
		cancel()
		n := 0
		for id := range tasks {
			if ended[id] {
				n++
			}
		}
		if n == len(tasks) {
			return n
		}
		if time.Now().After(deadline) {
			t.Logf("after %s, %d of %d tasks have ended (last read: %v)", drain, n, len(tasks), err)
			return n
		}
		time.Sleep(time.Second)
	}
}

// readEndings reads the terminal records stored from sequence *next on.
func readEndings(ctx context.Context, js jetstream.JetStream, next *uint64, ended map[string]bool) error {
	cons, err := js.OrderedConsumer(ctx, services.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.StageFilter(events.StageSucceeded), events.StageFilter(events.StageCancelled), events.ReviewFilter},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: *next, InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return err
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending == 0 {
			return nil
		}
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		for msg := range batch.Messages() {
			md, err := msg.Metadata()
			if err != nil {
				return err
			}
			*next = md.Sequence.Stream + 1
			if id, _, ok := events.ParseTaskSubject(msg.Subject()); ok {
				ended[id] = true
			} else if reason, key, ok := events.ParseReviewSubject(msg.Subject()); ok && reason != events.ReviewAction {
				ended[key] = true
			}
		}
		if err := batch.Error(); err != nil {
			return err
		}
	}
}

// waitIdle waits until no stage consumer has anything pending or unacked.
func waitIdle(t *testing.T, js jetstream.JetStream, within time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		idle, busy, err := faults.Idle(ctx, js)
		cancel()
		if idle {
			return true
		}
		if time.Now().After(deadline) {
			t.Logf("the mesh is not idle after %s: %s (%v)", within, busy, err)
			return false
		}
		time.Sleep(500 * time.Millisecond)
	}
}
