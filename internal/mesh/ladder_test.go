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

	"dispatchmesh/events"
	"dispatchmesh/history"
	"dispatchmesh/internal/openaitest"
	"dispatchmesh/internal/policy"
	"dispatchmesh/services"
	"dispatchmesh/services/recorder"
	"dispatchmesh/trust"
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
	rec, err := recorder.New(recorder.Config{
		Tasks: services.NewTaskStore(stores.Tasks), Trust: trust.NewStore(stores.Trust, trust.Policy{}),
		History: history.NewStore(stores.History, 0), Policy: e.pol, Log: quiet,
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
			victim.Close() // KV written, nothing published, nothing acked
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
		t.Fatalf("ended with %s: %v", got, stages(all))
	}

	reqs := e.model.Requests()
	if len(reqs) != policy.DefaultMaxRetries {
		t.Fatalf("model calls = %d, want max_retries = %d", len(reqs), policy.DefaultMaxRetries)
	}
	var rungs []string
	for _, r := range reqs {
		m := rungAttr.FindStringSubmatch(r.Messages[1].Content)
		if m == nil {
			t.Fatalf("prompt without rung instructions:\n%s", r.Messages[1].Content)
		}
		rungs = append(rungs, m[1])
	}
	if want := "REFINE REFINE PIVOT PIVOT RESEARCH PIVOT PIVOT"; strings.Join(rungs, " ") != want {
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
	for i, a := range rec1.Attempts {
		if a.Attempt != i+1 || a.Rung != rungs[i] || a.Outcome != events.OutcomeFailure || a.Reason == "" {
			t.Errorf("attempt %d in the tree: %+v", i+1, a)
		}
	}
	st := e.state(id)
	if st.Status != events.StatusBlocked || st.PivotCount != 4 || len(st.DeadEnds) != 7 || st.Attempts != 7 {
		t.Fatalf("state: %s pivot_count=%d dead_ends=%d attempts=%d", st.Status, st.PivotCount, len(st.DeadEnds), st.Attempts)
	}
	if n := count(e.events(id), events.StageExecuted); n != 7 {
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
	if m := rungAttr.FindStringSubmatch(e.model.Requests()[3].Messages[1].Content); m == nil || m[1] != events.RungPivot {
		t.Fatalf("a recurring failure started on %v", m)
	}
}

// Several hopeless tasks of one type at once: the trust gate weighs whether a
// task is dispatched, not its retries, so each climbs its whole ladder and
// ends as one blocked record after exactly max_retries attempts — while a new
// task of the type, arriving afterwards, is gated.
func TestHopelessTasksClimbTheirWholeLadder(t *testing.T) {
	e := newEnv(t, func(n int, _ openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Failure("the same idea", "still failing")}
	}, nil)
	e.start()
	ids := []string{"h1", "h2", "h3"}
	for _, id := range ids {
		e.submit(events.Submit{ID: id, Type: "bug_fix", Subject: id + ".go"})
	}
	for _, id := range ids {
		if got := last(e.waitEnd(id)).Stage; got != "review.escalated" {
			t.Fatalf("%s ended with %s", id, got)
		}
		if st := e.state(id); st.Attempts != policy.DefaultMaxRetries || st.Status != events.StatusBlocked {
			t.Fatalf("%s: %d attempts, %s", id, st.Attempts, st.Status)
		}
	}
	if n := len(e.reviews(events.ReviewEscalated)); n != 3 {
		t.Fatalf("%d escalation records, want 3", n)
	}
	e.submit(events.Submit{ID: "h4", Type: "bug_fix", Subject: "h4.go"})
	if got := last(e.waitEnd("h4")).Stage; got != "review.gated" {
		t.Fatalf("a new task of a type at trust 0 ended with %s", got)
	}
}
