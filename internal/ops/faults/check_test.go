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

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/faults"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// The checker passes a mesh that ran cleanly, and finds each broken
// invariant once the stores are tampered with: an outcome's spend counted
// twice (what a recorder redelivered after its outcome left the trust window
// did before spend had its own deduplicated counters), a lost history
// entry, a history entry kept twice and history entries out of order (a
// record written by hand), a trust outcome stored twice (published again
// after the deduplication window), a second terminal record, a task
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
	cl, err := client.New(srv.NC)
	if err != nil {
		t.Fatal(err)
	}
	tasks := submit(ctx, cl, w, 0).wait(t)
	if n := waitEnded(t, srv.JS, tasks, patience); n != len(tasks) {
		t.Fatalf("%d of %d tasks ended", n, len(tasks))
	}
	waitIdle(t, srv.JS, patience)
	in := faults.Input{JS: srv.JS, Policy: pol, Tasks: tasks, Calls: model.ledger, Slack: time.Second}
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
	histKV, err := srv.JS.KeyValue(ctx, services.BucketHistory)
	if err != nil {
		t.Fatal(err)
	}
	update(t, histKV, history.Key("triage_fix", "src/k0.go"), func(r *history.Record) {
		lost := func(e history.Entry) bool { return e.Key == "k-01:1:outcome" } // k-01's first attempt, lost
		r.Outcomes = slices.DeleteFunc(r.Outcomes, lost)
		r.Failures = slices.DeleteFunc(r.Failures, lost)
		for _, e := range r.Failures { // k-02's first failure, kept twice
			if e.Key == "k-02:1:outcome" {
				r.Failures = append(r.Failures, e)
				break
			}
		}
	})
	update(t, histKV, history.Key("triage_fix", "src/k2.go"), func(r *history.Record) { // out of order
		r.Outcomes[0], r.Outcomes[1] = r.Outcomes[1], r.Outcomes[0]
	})
	for _, m := range stored(t, srv.JS, trust.OutcomeStream, trust.OutcomeSubject("triage_fix")) { // k-00's outcome, stored twice
		if m.key == "k-00:1:outcome" {
			republish(t, srv.JS, m)
		}
	}
	base := func(id string) events.Base {
		return events.Base{Task: events.Task{ID: id, Type: "triage_fix", Subject: "src/x.go"}, Run: events.Run{Pass: 9, Attempt: 9}}
	}
	publish(t, srv.JS, events.TaskSubject("k-03", events.StageSucceeded), events.Succeeded{Base: base("k-03")})
	publish(t, srv.JS, events.TaskSubject("k-never-ends", events.StageQueued), events.Queued{Base: base("k-never-ends")})
	publish(t, srv.JS, events.IndexSubject("triage_fix", "src/k1.go"), events.IndexEntry{ID: "k-04", Type: "triage_fix", Subject: "src/k1.go"})
	in.Tasks["k-never-ends"] = faults.Plan{Answers: "S"}
	in.Tasks["k-lost"] = faults.Plan{Answers: "S"}
	calls := append(model.ledger(), faults.Call{Instance: "inproc", Task: "k-00", Pass: 7, Attempt: 7, Answer: 'S', Status: 200, Answered: true, Start: time.Now()})
	in.Calls = func() []faults.Call { return calls }

	// Read as a running mesh, the stopped one never stands still: the
	// queued event nobody consumes keeps it busy, and Check reads nothing.
	busyCtx, cancelBusy := context.WithTimeout(ctx, 3*time.Second)
	_, err = faults.Check(busyCtx, in)
	cancelBusy()
	if err == nil || !strings.Contains(err.Error(), "did not stand still") {
		t.Errorf("check of a busy mesh: err = %v, want it did not stand still", err)
	}

	in.Stopped = true
	rep, err = faults.Check(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		faults.KindDrift:      "spend of triage_fix/",
		faults.KindRebuild:    "spend triage_fix/",
		faults.KindHistory:    "task k-01: attempt k-01:1:outcome has no history entry among the failures of triage_fix \"src/k0.go\"",
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
	for _, also := range []faults.Problem{
		{Kind: faults.KindDuplicated, Detail: "task k-04: 2 entries in the task index"},
		{Kind: faults.KindHistory, Detail: "task k-01: attempt k-01:1:outcome has no history entry among the outcomes of"},
		{Kind: faults.KindDuplicated, Detail: "task k-02: history entry k-02:1:outcome is kept 2 times among the failures of triage_fix \"src/k0.go\""},
		{Kind: faults.KindHistory, Detail: "the outcomes of triage_fix \"src/k2.go\" are kept in the order "},
		{Kind: faults.KindDrift, Detail: "outcome k-00:1:outcome stored 2 times on " + trust.OutcomeSubject("triage_fix")},
		{Kind: faults.KindRebuild, Detail: services.BucketHistory + " " + history.Key("triage_fix", "src/k0.go") + ": outcomes live=4 entries rebuilt=5 entries, only here: k-01:1:outcome"},
		{Kind: faults.KindRebuild, Detail: services.BucketHistory + " " + history.Key("triage_fix", "src/k2.go") + ": outcomes live=in the order "},
	} {
		if !slices.ContainsFunc(rep.Problems, func(p faults.Problem) bool { return p.Kind == also.Kind && strings.Contains(p.String(), also.Detail) }) {
			t.Errorf("no %s problem saying %q; problems:\n%v", also.Kind, also.Detail, rep.Problems)
		}
	}
	// Lost: k-lost; stranded: k-never-ends; duplicated: k-03's terminal
	// record, k-04's index entry, k-02's history entry; drift: the spend,
	// k-00's outcome.
	if rep.Lost != 1 || rep.Stranded != 1 || rep.Duplicated != 3 || rep.CounterDrift != 2 {
		t.Errorf("counts:\n%s", rep)
	}
}

// update changes the value of key in kv, as a hand-written put would.
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

// storedMsg is one message of a stream.
type storedMsg struct {
	subject, key string
	seq          uint64
	data         []byte
}

// stored is every message of stream on filter, with the key of its JSON.
func stored(t *testing.T, js jetstream.JetStream, stream, filter string) []storedMsg {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []storedMsg
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(pending), jetstream.FetchMaxWait(patience))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			var k struct {
				Key string `json:"key"`
			}
			_ = json.Unmarshal(m.Data(), &k)
			out = append(out, storedMsg{subject: m.Subject(), key: k.Key, seq: md.Sequence.Stream, data: m.Data()})
			pending--
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// republish stores m's message once more, as a recorder's publish after
// the deduplication window would.
func republish(t *testing.T, js jetstream.JetStream, m storedMsg) {
	t.Helper()
	if _, err := js.Publish(context.Background(), m.subject, m.data, jetstream.WithMsgID(m.key+":again")); err != nil {
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
