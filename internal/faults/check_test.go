package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/history"
	"dispatchmesh/internal/faults"
	"dispatchmesh/internal/mesh"
	"dispatchmesh/internal/natstest"
	"dispatchmesh/internal/proctest"
	"dispatchmesh/services"
	"dispatchmesh/services/executor"
	"dispatchmesh/trust"
)

// The checker passes a mesh that ran cleanly, and finds each broken
// invariant once the stores are tampered with: an outcome's spend counted
// twice (what a recorder redelivered after its outcome left the trust window
// did before spend had its own deduplicated counters), a lost history entry, a second terminal record, a task
// submitted and never seen, one queued and never ended, and a model call
// for a pass without an outcome.
func TestCheckerFindsWhatIsBroken(t *testing.T) {
	srv := natstest.Start(t)
	w := &workload{plans: map[string]faults.Plan{}}
	plans := []string{"S", "FS", "DS", "F", "FFS"}
	for i := range 15 {
		tk := task{id: fmt.Sprintf("k-%02d", i), typ: "triage_fix", subject: fmt.Sprintf("src/k%d.go", i/3), plan: faults.Plan{Answers: plans[i%len(plans)]}}
		w.tasks = append(w.tasks, tk)
		w.plans[tk.id] = tk.plan
	}
	model := startModel(t, w.plan, 0, 10*time.Millisecond)
	_, pol := writePolicy(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- mesh.Run(ctx, mesh.Options{
			NC: srv.NC, Policy: pol, Provision: true, AckWait: ackWait, Grace: grace,
			Model: executor.NewOpenAI(executor.OpenAIConfig{BaseURL: model.baseURL("inproc"), APIKey: "test"}),
			Log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("mesh: %v", err)
			}
		}
	}
	defer stop()
	proctest.WaitFor(t, patience, "the mesh to provision", func() error { _, err := srv.JS.KeyValue(ctx, services.BucketTasks); return err })
	tasks := submit(ctx, srv.JS, w, 0).wait(t)
	if n := waitEnded(t, srv.JS, tasks, patience); n != len(tasks) {
		t.Fatalf("%d of %d tasks ended", n, len(tasks))
	}
	waitIdle(t, srv.JS, patience)
	in := faults.Input{JS: srv.JS, Policy: pol, Tasks: tasks, Calls: model.ledger(), Slack: time.Second}
	rep, err := faults.Check(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Terminal != len(tasks) || rep.Attempts == 0 {
		t.Fatalf("a clean run:\n%s\n%v", rep, rep.Problems)
	}

	// Tamper, with the mesh stopped.
	stop()
	ctx = context.Background()
	spending := trust.NewSpending(srv.JS, services.CounterStream)
	spent, err := spending.All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range spent { // an outcome's spend counted twice
		if d.Type == "triage_fix" {
			more := d
			more.Tokens += 150
			if err := spending.CorrectTo(ctx, d, more); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	histKV, _ := srv.JS.KeyValue(ctx, services.BucketHistory)
	update(t, histKV, history.Key("triage_fix", "src/k0.go"), func(r *history.Record) {
		r.Entries = slices.DeleteFunc(r.Entries, func(e history.Entry) bool { return e.TaskID == "k-01" })
	})
	base := func(id string) events.Base {
		return events.Base{Task: events.Task{ID: id, Type: "triage_fix", Subject: "src/x.go"}, Run: events.Run{Pass: 9, Attempt: 9}}
	}
	publish(t, srv.JS, events.TaskSubject("k-03", events.StageSucceeded), events.Succeeded{Base: base("k-03")})
	publish(t, srv.JS, events.TaskSubject("k-never-ends", events.StageQueued), events.Queued{Base: base("k-never-ends")})
	publish(t, srv.JS, events.IndexSubject("triage_fix", "src/k1.go"), events.IndexEntry{ID: "k-04", Type: "triage_fix", Subject: "src/k1.go"})
	in.Tasks["k-never-ends"] = faults.Plan{Answers: "S"}
	in.Tasks["k-lost"] = faults.Plan{Answers: "S"}
	in.Calls = append(in.Calls, faults.Call{Instance: "inproc", Task: "k-00", Pass: 7, Attempt: 7, Answer: 'S', Status: 200, Answered: true, Start: time.Now()})

	rep, err = faults.Check(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		faults.KindDrift:      "spend of triage_fix/",
		faults.KindRebuild:    "spend triage_fix/",
		faults.KindHistory:    "task k-01: attempt k-01:1:outcome has no history entry",
		faults.KindDuplicated: "task k-03: 2 terminal records",
		faults.KindState:      "task k-never-ends: queued but not in the task index",
		faults.KindStranded:   "task k-never-ends: no terminal record",
		faults.KindLost:       "task k-lost: submitted",
		faults.KindCalls:      "task k-00: the model was called 1 times for pass 7",
	}
	for kind, text := range want {
		if !slices.ContainsFunc(rep.Problems, func(p faults.Problem) bool { return p.Kind == kind && strings.Contains(p.String(), text) }) {
			t.Errorf("no %s problem saying %q; problems:\n%v", kind, text, rep.Problems)
		}
	}
	if !slices.ContainsFunc(rep.Problems, func(p faults.Problem) bool {
		return p.Kind == faults.KindDuplicated && strings.Contains(p.String(), "task k-04: 2 entries in the task index")
	}) {
		t.Errorf("no problem for k-04's second index entry; problems:\n%v", rep.Problems)
	}
	if rep.Lost != 1 || rep.Stranded != 1 || rep.Duplicated != 2 || rep.CounterDrift != 1 {
		t.Errorf("counts:\n%s", rep)
	}
}

func update[T any](t *testing.T, kv jetstream.KeyValue, key string, change func(*T)) {
	t.Helper()
	e, err := kv.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	var v T
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		t.Fatal(err)
	}
	change(&v)
	data, _ := json.Marshal(v)
	if _, err := kv.Put(context.Background(), key, data); err != nil {
		t.Fatal(err)
	}
}

func publish(t *testing.T, js jetstream.JetStream, subject string, v any) {
	t.Helper()
	data, _ := json.Marshal(v)
	if _, err := js.Publish(context.Background(), subject, data); err != nil {
		t.Fatal(err)
	}
}
