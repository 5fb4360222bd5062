package mesh_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/openaitest"
	"github.com/dispatchmesh/dispatchmesh/internal/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/rebuild"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// After a run with concurrent recorders — successes, ladder climbs,
// escalations, held and stale tasks — rebuilding every store from the
// stream finds no difference; a tampered store is found and restored:
// a task state, the gate's facts, an outcome lost from the outcome stream
// and a subject's history record lost from the history bucket.
func TestRebuildAgreesWithLiveStores(t *testing.T) {
	// Held tasks stay held while the stores are compared: no probe of the
	// held for an hour.
	pol := &policy.File{Defaults: policy.Type{ProbeInterval: policy.Duration(time.Hour)}, Types: map[string]policy.Type{
		"stale_fix": {Verifier: &policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"sh", "-c", "exit 1"}}},
		"bug_fix":   {MaxRetries: 3},
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
			e.submit(events.Submit{ID: id, Type: typ, Subject: subject, Payload: []byte(`{"what":"` + subject + `"}`)})
		}()
	}
	wg.Wait()
	for _, id := range ids {
		e.waitSettled(id) // ended, or held for bug_fix's trust
	}

	ctx := context.Background()
	stores, err := services.OpenStores(ctx, e.srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	live := rebuild.Live{Tasks: stores.Tasks, Trust: stores.Trust, History: stores.History, JS: e.srv.JS}
	built, err := rebuild.Replay(ctx, e.srv.JS, rebuild.Options{Policy: e.pol})
	if err != nil {
		t.Fatal(err)
	}
	if len(built.Tasks) != 30 || len(built.Trust) != 1 || len(built.Trust["bug_fix"].Outcomes) == 0 || len(built.History) == 0 {
		t.Fatalf("rebuilt %d tasks, %d types, %d histories", len(built.Tasks), len(built.Trust), len(built.History))
	}
	diffs, err := rebuild.Compare(ctx, live, built)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Errorf("difference after a normal run: %s", d)
	}

	// Tamper with a task, the gate's facts, an outcome and a history:
	// rebuild finds each and -apply restores them.
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
	diffs, err = rebuild.Compare(ctx, live, built)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, d := range diffs {
		found[d.Store+"/"+d.Key] = true
	}
	for _, want := range []string{services.BucketTasks + "/r-0", services.BucketTrust + "/bug_fix",
		rebuild.StoreOutcomes + "/bug_fix", services.BucketHistory + "/" + hard} {
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
}
