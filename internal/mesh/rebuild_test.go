package mesh_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// After a run with concurrent recorders — successes, ladder climbs,
// escalations, held and stale tasks — rebuilding every store from the
// stream finds no difference, the held index included (an entry for each
// held task); a tampered store is found and restored: a task state, the
// gate's facts, an outcome lost from the outcome stream, a subject's
// history record lost from the history bucket and a held pass's entry
// lost from the held index.
func TestRebuildAgreesWithLiveStores(t *testing.T) {
	// Held tasks stay held while the stores are compared: no probe of the
	// held for an hour.
	pol := &policy.File{Defaults: policy.Type{ProbeInterval: policy.Duration(time.Hour)}, Types: map[string]policy.Type{
		"stale_fix": {Verifier: &policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"sh", "-c", "exit 1"}}},
		"bug_fix":   {MaxRetries: 3},
		// Scored after 3 tasks, each one attempt that fails: then held.
		"doomed_fix": {MaxRetries: 1, MinOutcomes: 3},
	}}
	e := newEnv(t, func(n int, r openaitest.Request) openaitest.Reply {
		if strings.Contains(r.Messages[1].Content, "hard") || n%3 == 0 {
			return openaitest.Reply{Content: openaitest.Failure(fmt.Sprintf("idea %d", n), "nope")}
		}
		return openaitest.Reply{Content: openaitest.Success("fine")}
	}, pol)
	e.start(services.ConsumerIntake, services.ConsumerVerifier, services.ConsumerGate, services.ConsumerPrompt, services.ConsumerExecutor)
	for range 3 {
		e.start(services.ConsumerRecorder)
	}
	var ids []string
	var wg sync.WaitGroup
	for i := range 30 {
		typ, subject := "bug_fix", fmt.Sprintf("f%d.go", i%7)
		switch i % 5 {
		case 1:
			typ = "stale_fix"
		case 2:
			subject = "hard.go"
		}
		id := fmt.Sprintf("r-%d", i)
		ids = append(ids, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every other task names a callback: the rebuilt state keeps it.
			sub := events.Submit{ID: id, Type: typ, Subject: subject, Payload: []byte(`{"what":"` + subject + `"}`)}
			if i%2 == 0 {
				sub.CallbackURL = "https://hooks.example.com/" + id
			}
			e.submit(sub)
		}()
	}
	wg.Wait()
	for _, id := range ids {
		e.waitSettled(id) // ended, or held for bug_fix's trust
	}
	// doomed_fix fails, one task after the other, until its trust holds
	// the next ones.
	for i := range 3 {
		id := e.submit(events.Submit{ID: fmt.Sprintf("doomed-%d", i), Type: "doomed_fix", Subject: "hard.go"})
		ids = append(ids, id)
		e.waitEnd(id)
	}
	for i := range 2 {
		id := e.submit(events.Submit{ID: fmt.Sprintf("doomed-held-%d", i), Type: "doomed_fix", Subject: "hard.go"})
		ids = append(ids, id)
		e.waitSettled(id)
	}

	ctx := context.Background()
	stores, err := services.OpenStores(ctx, e.srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	// A held task's pass sleeps in the held index once the gate's held
	// consumer has looked at its held event (after the task's state said
	// held): wait for each one's entry.
	var held []string
	for _, id := range ids {
		if e.state(id).Status == events.StatusHeld {
			held = append(held, id)
		}
	}
	if !slices.Contains(held, "doomed-held-0") || !slices.Contains(held, "doomed-held-1") {
		t.Fatalf("held tasks %v: want doomed_fix's last two among them", held)
	}
	asleep := map[string]string{} // held task → its entry's key
	waitFor(t, "every held task asleep in the held index", func() bool {
		lister, err := stores.Held.ListKeys(ctx)
		if err != nil {
			return false
		}
		for k := range lister.Keys() {
			if _, _, id, _, ok := services.ParseHeldKey(k); ok {
				asleep[id] = k
			}
		}
		for _, id := range held {
			if asleep[id] == "" {
				return false
			}
		}
		return true
	})
	live := rebuild.Live{Tasks: stores.Tasks, Trust: stores.Trust, History: stores.History, Held: stores.Held, JS: e.srv.JS}
	built, err := rebuild.Replay(ctx, e.srv.JS, rebuild.Options{Policy: e.pol})
	if err != nil {
		t.Fatal(err)
	}
	if len(built.Tasks) != len(ids) || len(built.Trust) != 2 || len(built.Trust["bug_fix"].Outcomes) == 0 || len(built.History) == 0 ||
		len(built.Held) != len(held) {
		t.Fatalf("rebuilt %d tasks, %d types, %d histories, %d held passes (%d tasks held)",
			len(built.Tasks), len(built.Trust), len(built.History), len(built.Held), len(held))
	}
	for _, id := range held {
		if built.Held[asleep[id]] == nil {
			t.Errorf("held task %s: no rebuilt entry under its live key %s", id, asleep[id])
		}
	}
	diffs, err := rebuild.Compare(ctx, live, built)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Errorf("difference after a normal run: %s", d)
	}

	// Tamper with a task, the gate's facts, an outcome, a history and the
	// held index: rebuild finds each and -apply restores them.
	if _, err := stores.Tasks.Put(ctx, "r-0", []byte(`{"id":"r-0","status":"failed"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := stores.Trust.Put(ctx, "bug_fix", []byte(`{"type":"bug_fix","block_streak":4}`)); err != nil {
		t.Fatal(err)
	}
	outcomes, err := e.srv.JS.Stream(ctx, trust.OutcomeStream)
	if err != nil {
		t.Fatal(err)
	}
	last, err := outcomes.GetLastMsgForSubject(ctx, trust.OutcomeSubject("bug_fix"))
	if err != nil {
		t.Fatal(err)
	}
	if err := outcomes.DeleteMsg(ctx, last.Sequence); err != nil {
		t.Fatal(err)
	}
	hard := history.Key("bug_fix", "hard.go")
	if err := stores.History.Delete(ctx, hard); err != nil {
		t.Fatal(err)
	}
	lost := asleep[held[0]]
	if err := stores.Held.Delete(ctx, lost); err != nil {
		t.Fatal(err)
	}
	diffs, err = rebuild.Compare(ctx, live, built)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, d := range diffs {
		found[d.Store+"/"+d.Key] = true
	}
	for _, want := range []string{services.BucketTasks + "/r-0", services.BucketTrust + "/bug_fix",
		rebuild.StoreOutcomes + "/bug_fix", services.BucketHistory + "/" + hard, services.BucketHeld + "/" + lost} {
		if !found[want] {
			t.Errorf("tampering with %s not found: %v", want, diffs)
		}
	}
	if err := rebuild.Apply(ctx, live, built); err != nil {
		t.Fatal(err)
	}
	if diffs, _ = rebuild.Compare(ctx, live, built); len(diffs) != 0 {
		t.Fatalf("after apply: %v", diffs)
	}
	if err := rebuild.Apply(ctx, live, built); err != nil { // again: nothing changes
		t.Fatal(err)
	}
	if diffs, _ = rebuild.Compare(ctx, live, built); len(diffs) != 0 {
		t.Fatalf("after a second apply: %v", diffs)
	}
	if st := e.state("r-0"); st.Status == events.StatusFailed {
		t.Fatal("task state not restored")
	}
	if entry, err := stores.Held.Get(ctx, lost); err != nil {
		t.Fatalf("held entry %s not restored: %v", lost, err)
	} else if got, err := services.DecodeHeldEntry(lost, entry.Value()); err != nil || got.Task != held[0] || got.Seq == 0 {
		t.Fatalf("held entry %s restored as %+v (%v)", lost, got, err)
	}
}
