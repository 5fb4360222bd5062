package mesh_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/recorder"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

var rungAttr = regexp.MustCompile(`<instructions rung="([A-Z]+)">`)

// A model that never succeeds: every task ends as one blocked record after
// exactly max_retries attempts, climbing REFINE, REFINE, PIVOT, PIVOT,
// RESEARCH, PIVOT, PIVOT — even when the recorder dies mid-message.
func TestLadderHandsOffOnceAfterMaxRetries(t *testing.T) {
	e := newEnv(t, func(n int, _ openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Failure(fmt.Sprintf("approach number %d", n), "tests still fail")}
	}, nil)
	e.start(services.ConsumerIntake, services.ConsumerVerifier, services.ConsumerGate, services.ConsumerPrompt, services.ConsumerExecutor)

	// A recorder that records attempt 3 in full, then dies before it can ack.
	victim, vjs := e.srv.Connect(t)
	stores, err := services.Provision(context.Background(), vjs, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	view, err := trust.NewView(context.Background(), vjs, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Stop()
	rec, err := recorder.New(recorder.Config{
		Tasks: services.NewTaskStore(stores.Tasks), History: history.NewStore(stores.History), Trust: view, CountSpend: true, Policy: e.pol, Log: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	crashed := make(chan struct{})
	var once atomic.Bool
	spec := rec.Spec()
	spec.AckWait = 2 * time.Second
	inner := spec.Handler
	spec.Handler = func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		outs, err := inner(ctx, m)
		if bytes.Contains(m.Data, []byte(`"attempt":3,`)) && once.CompareAndSwap(false, true) {
			victim.Close() // task state written, nothing published (outcome, history, retry), nothing acked
			close(crashed)
			return nil, context.Canceled
		}
		return outs, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go (&services.Router{JS: vjs, Log: quiet}).Run(ctx, spec)

	id := e.submit(events.Submit{ID: "never", Type: "bug_fix", Subject: "a.go"})
	<-crashed
	e.start(services.ConsumerRecorder)
	all := e.waitEnd(id)
	if got := last(all).Stage; got != "review.escalated" {
		t.Fatalf("ended with %s: %v", got, timeline.Stages(all))
	}

	reqs := e.model.Requests()
	if len(reqs) != policy.DefaultMaxRetries {
		t.Fatalf("model calls = %d, want max_retries = %d", len(reqs), policy.DefaultMaxRetries)
	}
	var rungs []string
	for i, r := range reqs {
		m := rungAttr.FindStringSubmatch(r.Messages[1].Content)
		switch {
		case m == nil && i == 0: // a first attempt has nothing to refine yet
			rungs = append(rungs, "-")
		case m == nil:
			t.Fatalf("prompt without rung instructions:\n%s", r.Messages[1].Content)
		default:
			rungs = append(rungs, m[1])
		}
	}
	if want := "- REFINE PIVOT PIVOT RESEARCH PIVOT PIVOT"; strings.Join(rungs, " ") != want {
		t.Fatalf("rungs = %v, want %s", rungs, want)
	}
	// PIVOT prompts list the dead ends so far.
	if p := reqs[2].Messages[1].Content; !strings.Contains(p, "<dead_ends>") || !strings.Contains(p, "approach number 1") || !strings.Contains(p, "approach number 2") {
		t.Errorf("first PIVOT prompt lacks the dead ends:\n%s", p)
	}

	esc := e.reviews(events.ReviewEscalated)
	if len(esc) != 1 {
		t.Fatalf("%d escalation records, want exactly 1", len(esc))
	}
	var rec1 events.Escalated
	if err := json.Unmarshal(esc[0].Data, &rec1); err != nil {
		t.Fatal(err)
	}
	if len(rec1.Attempts) != 7 || rec1.TokensIn != 700 {
		t.Fatalf("escalation tree has %d attempts, %d tokens in", len(rec1.Attempts), rec1.TokensIn)
	}
	rungs[0] = string(events.RungRefine) // the first attempt runs on REFINE, with no instructions yet
	for i, a := range rec1.Attempts {
		if a.Attempt != i+1 || string(a.Rung) != rungs[i] || a.Outcome != events.OutcomeFailure || a.Reason == "" {
			t.Errorf("attempt %d in the tree: %+v", i+1, a)
		}
	}
	st := e.state(id)
	if st.Status != events.StatusBlocked || st.PivotCount != 4 || len(st.DeadEnds) != 7 || st.Attempts != 7 {
		t.Fatalf("state: %s pivot_count=%d dead_ends=%d attempts=%d", st.Status, st.PivotCount, len(st.DeadEnds), st.Attempts)
	}
	if n := timeline.Count(e.events(id), events.StageExecuted); n != 7 {
		t.Fatalf("%d executed events", n)
	}
}

// On PIVOT an answer that repeats a dead end is rejected, not progress.
func TestPivotRejectsARepeatedDeadEnd(t *testing.T) {
	e := newEnv(t, func(n int, _ openaitest.Request) openaitest.Reply {
		if n <= 3 { // attempt 3 is the first PIVOT: it repeats attempt 1's approach
			return openaitest.Reply{Content: openaitest.Failure(map[int]string{1: "Null check in handleResponse()", 2: "retry fetch", 3: "null-check in handleResponse"}[n], "nope")}
		}
		return openaitest.Reply{Content: openaitest.Success("guard parsePayload()")}
	}, nil)
	e.start()
	id := e.submit(events.Submit{ID: "repeat", Type: "bug_fix", Subject: "api.ts"})
	if got := last(e.waitEnd(id)).Stage; got != events.StageSucceeded {
		t.Fatalf("ended with %s", got)
	}
	st := e.state(id)
	if st.History[2].Rung != events.RungPivot || !strings.Contains(st.History[2].Reason, "repeats the dead end of attempt 1") {
		t.Fatalf("attempt 3: %+v", st.History[2])
	}
	if len(st.DeadEnds) != 2 {
		t.Fatalf("dead ends = %+v (a repeat is not a new dead end)", st.DeadEnds)
	}
	// The fourth attempt is told why the third was rejected, and asked to commit to a change.
	p := e.model.Requests()[3].Messages[1].Content
	if !strings.Contains(p, "repeats the dead end") || !strings.Contains(p, "<pre_commit>") {
		t.Fatalf("fourth prompt:\n%s", p)
	}
}

// A subject that failed 3+ times in 7 days starts its next task on PIVOT.
func TestRecurringFailureStartsOnPivot(t *testing.T) {
	e := newEnv(t, func(n int, _ openaitest.Request) openaitest.Reply {
		if n <= 3 {
			return openaitest.Reply{Content: openaitest.Failure(fmt.Sprintf("try %d", n), "broken")}
		}
		return openaitest.Reply{Content: openaitest.Success("something new")}
	}, nil)
	e.start()
	for i := range 3 {
		id := fmt.Sprintf("flaky-%d", i)
		e.submit(events.Submit{ID: id, Type: "bug_fix", Subject: "flaky.go", MaxRetries: 1})
		e.waitEnd(id)
	}
	e.submit(events.Submit{ID: "flaky-next", Type: "bug_fix", Subject: "flaky.go"})
	e.waitEnd("flaky-next")
	if m := rungAttr.FindStringSubmatch(e.model.Requests()[3].Messages[1].Content); m == nil || m[1] != string(events.RungPivot) {
		t.Fatalf("a recurring failure started on %v", m)
	}
}

// Several hopeless tasks of a new type at once: a few go first as canaries
// while the rest wait unspent, and once their outcomes score the type below
// the threshold the gate stops every ladder in flight: each task goes to
// review as gated, with what was tried, long before max_retries. A new task
// of the type is gated without a call.
func TestHopelessTasksStopWhenTrustCollapses(t *testing.T) {
	e := newEnv(t, func(n int, _ openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Failure(fmt.Sprintf("idea %d", n), "still failing")}
	}, &policy.File{Defaults: policy.Type{ProbeInterval: policy.Duration(time.Hour)}})
	e.start()
	// Ten hopeless tasks, one after the other: the first ladders climb
	// (nothing is known), then the type's own retries — none ever
	// succeeds — cut the later ladders short.
	attempts := 0
	for i := range trust.DefaultMinOutcomes {
		id := e.submit(events.Submit{ID: fmt.Sprintf("h%d", i), Type: "bug_fix", Subject: fmt.Sprintf("h%d.go", i)})
		if got := last(e.waitEnd(id)).Stage; got != "review.escalated" {
			t.Fatalf("%s ended with %s: %+v", id, got, e.state(id))
		}
		attempts += e.state(id).Attempts
	}
	if full := trust.DefaultMinOutcomes * policy.DefaultMaxRetries; attempts >= full/2 || e.model.Calls() != attempts {
		t.Fatalf("%d model calls for %d attempts, want fewer than half of %d full ladders", e.model.Calls(), attempts, full)
	}
	// Ten settled failures: the type scores 0 and the next task is held,
	// no call; the retry of a ladder in flight would be too.
	calls := e.model.Calls()
	e.submit(events.Submit{ID: "h-next", Type: "bug_fix", Subject: "h-next.go"})
	e.waitStage("h-next", events.StageHeld)
	if st := e.state("h-next"); st.Status != events.StatusHeld || e.model.Calls() != calls {
		t.Fatalf("a new task of a type at trust 0: %s after %d calls", st.Status, e.model.Calls()-calls)
	}
}

// A type whose REFINE retries never succeed but whose PIVOT retries do: once
// REFINE is measured, a task's retry skips it and runs on PIVOT — resolved,
// one call cheaper — instead of being handed off.
func TestRetrySkipsARungThatNeverSucceeds(t *testing.T) {
	e := newEnv(t, func(n int, req openaitest.Request) openaitest.Reply {
		if strings.Contains(req.Messages[1].Content, "<dead_ends>") {
			return openaitest.Reply{Content: openaitest.Success("a new idea")}
		}
		return openaitest.Reply{Content: openaitest.Failure(fmt.Sprintf("patch it %d", n), "still broken")}
	}, &policy.File{Types: map[string]policy.Type{"bug_fix": {RungMinSamples: 2}}})
	e.start()
	calls := map[string]int{}
	for i := range 4 {
		before := e.model.Calls()
		id := e.submit(events.Submit{ID: fmt.Sprintf("p%d", i), Type: "bug_fix", Subject: fmt.Sprintf("p%d.go", i)})
		if got := last(e.waitEnd(id)).Stage; got != events.StageSucceeded {
			t.Fatalf("%s ended with %s", id, got)
		}
		calls[id] = e.model.Calls() - before
	}
	if calls["p0"] != 3 || calls["p1"] != 3 || calls["p2"] != 2 || calls["p3"] != 2 {
		t.Fatalf("calls per task = %v, want 3 while REFINE is measured, then 2", calls)
	}
	if st := e.state("p3"); st.History[1].Rung != events.RungPivot {
		t.Fatalf("p3's retry ran on %s", st.History[1].Rung)
	}
}
