package mesh_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// policyKV is the policy bucket of a provisioned env.
func (e *env) policyKV() jetstream.KeyValue {
	e.t.Helper()
	kv, err := e.srv.JS.KeyValue(context.Background(), services.BucketPolicy)
	if err != nil {
		e.t.Fatal(err)
	}
	return kv
}

// startWatching runs the given services on their own connection with the
// policy of the bucket, followed by a KV watcher of that connection, and
// returns the watcher (to wait until it has seen a revision).
func (e *env) startWatching(instance string, names ...string) *policy.Source {
	e.t.Helper()
	nc, js := e.srv.Connect(e.t)
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := services.Provision(ctx, js, services.StreamConfig{}); err != nil {
		e.t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		e.t.Fatal(err)
	}
	src, err := policykv.Watch(ctx, js, kv, quiet)
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- mesh.Run(ctx, mesh.Options{
			NC: nc, Services: names, Policy: src, Instance: instance,
			Model: executor.NewOpenAI(executor.OpenAIConfig{BaseURL: e.model.BaseURL(), APIKey: "test"}),
			Log:   slog.New(slog.NewTextHandler(io.Discard, nil)), AckWait: 2 * time.Second, Grace: 5 * time.Second,
		})
	}()
	e.waitProvisioned(done)
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("mesh %s stopped with %v", instance, err)
		}
	})
	return src
}

func waitSeen(t *testing.T, rev uint64, srcs ...*policy.Source) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for i, src := range srcs {
		if err := src.Seen(ctx, rev); err != nil {
			t.Fatalf("watcher %d never saw policy revision %d: %v", i, rev, err)
		}
	}
}

// decision is what the gate decided for one task, read from its event.
type decision struct {
	by    string
	cause events.Cause
	rev   uint64
}

// gateDecision waits for the gate's event on the task.
func (e *env) gateDecision(id string) decision {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var d decision
	err := timeline.Follow(ctx, e.srv.JS, id, true, func(en timeline.Entry) bool {
		if en.Stage != events.StageAdmitted && en.Stage != "review."+events.ReviewGated {
			return true
		}
		var ev events.Admitted // a gated record has the same base and trust decision
		if err := jsonUnmarshal(en.Data, &ev); err != nil {
			e.t.Errorf("%s: %v", en.Subject, err)
		}
		d = decision{by: ev.By, cause: ev.Trust.Cause, rev: ev.PolicyRev}
		return false
	})
	if err != nil {
		e.t.Fatalf("no gate decision on %s: %v", id, err)
	}
	return d
}

// decideUntilBoth submits batches of css_fix tasks until both gate
// instances have decided some, and returns every decision.
func (e *env) decideUntilBoth(prefix string) []decision {
	e.t.Helper()
	var all []decision
	by := map[string]bool{}
	for batch := 0; len(by) < 2; batch++ {
		if batch == 20 {
			e.t.Fatalf("after %d batches only %v decided", batch, by)
		}
		ids := make([]string, 8)
		var wg sync.WaitGroup
		for i := range ids {
			ids[i] = fmt.Sprintf("%s-%d-%d", prefix, batch, i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.submit(events.Submit{ID: ids[i], Type: "css_fix", Subject: ids[i] + ".css"})
			}()
		}
		wg.Wait()
		for _, id := range ids {
			d := e.gateDecision(id)
			all = append(all, d)
			by[d.by] = true
		}
	}
	return all
}

// A policy put on the bucket the way `nats kv put dispatch_policy current`
// does it — a plain Put, no dispatch command involved — changes the next
// decision of both gate instances, each following the bucket with its own
// watcher; a put that does not decode is refused by both, and both keep
// deciding under the revision before it.
func TestPolicyPutChangesEveryGate(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start(services.ConsumerIntake, services.ConsumerVerifier) // no prompt: admitted tasks wait there
	kv := e.policyKV()
	ctx := context.Background()
	rev1, err := kv.Put(ctx, policy.Key, []byte(`{"types": {"css_fix": {"exempt": true}}}`))
	if err != nil {
		t.Fatal(err)
	}
	gates := []*policy.Source{e.startWatching("a", mesh.Gate), e.startWatching("b", mesh.Gate)}
	waitSeen(t, rev1, gates...)
	for _, d := range e.decideUntilBoth("v1") {
		if d.cause != events.CauseExempt || d.rev != rev1 {
			t.Fatalf("under revision %d: %+v, want exempt under %d", rev1, d, rev1)
		}
	}

	// Not exempt any more, and never gated (an explicit threshold of 0):
	// the gate admits the type as trusted.
	rev2, err := kv.Put(ctx, policy.Key, []byte(`{"types": {"css_fix": {"exempt": false, "threshold": 0}}}`))
	if err != nil {
		t.Fatal(err)
	}
	waitSeen(t, rev2, gates...)
	for _, d := range e.decideUntilBoth("v2") {
		if d.cause != events.CauseTrusted || d.rev != rev2 {
			t.Fatalf("under revision %d: %+v, want trusted under %d", rev2, d, rev2)
		}
	}

	// Not a policy: refused by every instance, revision 2 stays in force.
	rev3, err := kv.Put(ctx, policy.Key, []byte(`{"types": {"css_fix": {"exempt": "yes"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	waitSeen(t, rev3, gates...)
	for i, g := range gates {
		if g.Rev() != rev2 {
			t.Fatalf("gate %d runs revision %d after the bad put, want %d", i, g.Rev(), rev2)
		}
	}
	for _, d := range e.decideUntilBoth("v3") {
		if d.cause != events.CauseTrusted || d.rev != rev2 {
			t.Fatalf("after the refused revision %d: %+v, want trusted under %d", rev3, d, rev2)
		}
	}
}

// Tasks ran under two policies — the attempt limit raised between them —
// and dispatch rebuild, reading each event's revision from the bucket's
// history, reproduces the live stores; recomputing everything with the
// current policy does not (the test would catch a rebuild that ignored
// the revisions).
func TestRebuildAfterPolicyChange(t *testing.T) {
	e := newEnv(t, func(n int, r openaitest.Request) openaitest.Reply {
		if strings.Contains(r.Messages[1].Content, "hard") {
			return openaitest.Reply{Content: openaitest.Failure(fmt.Sprintf("idea %d", n), "nope")}
		}
		return openaitest.Reply{Content: openaitest.Success("fine")}
	}, nil)
	srcs := []*policy.Source{
		e.startWatching("m1", mesh.Intake, mesh.Verifier, mesh.Gate, mesh.Prompt, mesh.Executor, mesh.Recorder),
		e.startWatching("m2", mesh.Recorder),
	}
	kv := e.policyKV()
	ctx := context.Background()
	v1 := &policy.File{Types: map[string]policy.Type{"bug_fix": {MaxRetries: 2, Exempt: ptr(true)}}}
	rev1, err := policykv.Put(ctx, kv, v1)
	if err != nil {
		t.Fatal(err)
	}
	waitSeen(t, rev1, srcs...)
	run := func(prefix string) []string {
		var ids []string
		for i := range 4 {
			subject := fmt.Sprintf("%s-%d.go", prefix, i)
			if i%2 == 0 {
				subject = fmt.Sprintf("hard-%s-%d.go", prefix, i)
			}
			ids = append(ids, e.submit(events.Submit{ID: fmt.Sprintf("%s-%d", prefix, i), Type: "bug_fix", Subject: subject}))
		}
		for _, id := range ids {
			e.waitEnd(id)
		}
		return ids
	}
	first := run("one")
	if st := e.state(first[0]); st.Status != events.StatusBlocked || st.Attempts != 2 {
		t.Fatalf("under revision %d the hard task ended %s after %d attempts, want blocked after 2", rev1, st.Status, st.Attempts)
	}

	v2 := &policy.File{Types: map[string]policy.Type{"bug_fix": {MaxRetries: 4, Exempt: ptr(true)}}}
	rev2, err := policykv.Put(ctx, kv, v2)
	if err != nil {
		t.Fatal(err)
	}
	waitSeen(t, rev2, srcs...)
	second := run("two")
	if st := e.state(second[0]); st.Status != events.StatusBlocked || st.Attempts != 4 {
		t.Fatalf("under revision %d the hard task ended %s after %d attempts, want blocked after 4", rev2, st.Status, st.Attempts)
	}
	for _, en := range e.events(second[0]) {
		var ev struct{ events.Base }
		if jsonUnmarshal(en.Data, &ev) == nil && ev.PolicyRev != rev2 {
			t.Errorf("%s names policy revision %d, want %d", en.Subject, ev.PolicyRev, rev2)
		}
	}

	stores, err := services.OpenStores(ctx, e.srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	live := rebuild.Live{Tasks: stores.Tasks, Trust: stores.Trust, History: stores.History, Held: stores.Held, JS: e.srv.JS}
	revs, err := policykv.History(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	built, err := rebuild.Replay(ctx, e.srv.JS, rebuild.Options{Revisions: revs})
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := rebuild.Compare(ctx, live, built)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Errorf("difference after a policy change: %s", d)
	}

	// The same stream recomputed with today's policy only: the tasks of
	// revision 1 would have climbed to 4 attempts.
	current, err := rebuild.Replay(ctx, e.srv.JS, rebuild.Options{Policy: policy.Static(v2)})
	if err != nil {
		t.Fatal(err)
	}
	if diffs, err = rebuild.Compare(ctx, live, current); err != nil || len(diffs) == 0 {
		t.Fatalf("recomputing with the current policy found no difference (%v): the test cannot tell", err)
	}
}

// An event naming a revision the bucket does not hold is reported, never
// recomputed with a default.
func TestRebuildRefusesUnavailableRevision(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start() // every service, with the fixed (built-in) policy: events name no revision
	e.waitEnd(e.submit(events.Submit{ID: "old-1", Type: "css_fix", Subject: "a.css"}))
	revs, err := policykv.History(context.Background(), e.policyKV())
	if err != nil {
		t.Fatal(err)
	}
	_, err = rebuild.Replay(context.Background(), e.srv.JS, rebuild.Options{Revisions: revs})
	var ue *rebuild.UnavailableError
	if !errors.As(err, &ue) || len(ue.Revisions) != 1 || ue.Revisions[0].Rev != 0 || ue.Revisions[0].Events == 0 {
		t.Fatalf("replay: %v", err)
	}
	if !strings.Contains(err.Error(), "none recorded") || !strings.Contains(err.Error(), "dispatch rebuild -policy FILE") {
		t.Fatalf("the error does not say what is missing and what to do: %v", err)
	}
	built, err := rebuild.Replay(context.Background(), e.srv.JS, rebuild.Options{Revisions: revs, Fallback: &policy.File{}})
	if err != nil || len(built.Fallbacks) != 1 || built.Tasks["old-1"] == nil {
		t.Fatalf("with a fallback: %v %+v", err, built)
	}
}

func ptr[T any](v T) *T { return &v }
