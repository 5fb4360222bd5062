package mesh_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

func TestHappyPathThroughAllServices(t *testing.T) {
	e := newEnv(t, succeed, &policy.File{Types: map[string]policy.Type{
		"lint_fix": {Verifier: &policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"true"}}},
	}})
	e.start()
	// A type with a verifier goes through it; one without (css_fix) has
	// nothing to verify and goes from intake to the gate.
	checked := e.submit(events.Submit{ID: "happy-0", Type: "lint_fix", Subject: "src/app.go"})
	if got, want := timeline.Stages(e.waitEnd(checked)), []string{"queued", "verified", "admitted", "prompted", "executed", "succeeded"}; !slices.Equal(got, want) {
		t.Fatalf("stages with a verifier = %v, want %v", got, want)
	}
	id := e.submit(events.Submit{ID: "happy-1", Type: "css_fix", Subject: "src/app.css", Payload: []byte(`{"issue":"button misaligned"}`)})

	all := e.waitEnd(id)
	want := []string{"verified", "admitted", "prompted", "executed", "succeeded"}
	if got := timeline.Stages(all); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("stages = %v, want %v", got, want)
	}
	if v := all[0]; !strings.Contains(string(v.Data), `"verdict":"skipped"`) || !strings.HasPrefix(v.By, "intake@") {
		t.Errorf("first event %s by %q: %s, want intake's, verdict skipped", v.Subject, v.By, v.Data)
	}
	if n := e.model.Calls(); n != 2 {
		t.Fatalf("model called %d times, want 2 (one per task)", n)
	}
	req := e.model.Requests()[1]
	if !strings.Contains(req.Messages[1].Content, `{"issue":"button misaligned"}`) || !strings.Contains(req.Messages[1].Content, "src/app.css") {
		t.Errorf("prompt does not carry the task verbatim:\n%s", req.Messages[1].Content)
	}
	st := e.state(id)
	if st.Status != events.StatusSucceeded || st.Attempts != 1 || st.TokensIn != 100 || st.TokensOut != 50 {
		t.Errorf("state = %+v", st)
	}
	for _, en := range all {
		if en.By == "" {
			t.Errorf("%s event does not name the instance that produced it", en.Stage)
		}
	}
}

func TestStaleTaskIsCancelledWithoutModelCall(t *testing.T) {
	pol := &policy.File{Types: map[string]policy.Type{
		"css_fix": {Verifier: &policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"sh", "-c", "echo already fixed; exit 1"}}},
	}}
	e := newEnv(t, succeed, pol)
	e.start()
	id := e.submit(events.Submit{ID: "stale-1", Type: "css_fix", Subject: "src/app.css"})

	all := e.waitEnd(id)
	if got := last(all).Stage; got != events.StageCancelled {
		t.Fatalf("ended with %s, want cancelled (%v)", got, timeline.Stages(all))
	}
	if n := e.model.Calls(); n != 0 {
		t.Fatalf("model called %d times for a stale task", n)
	}
	if st := e.state(id); st.Status != events.StatusCancelled || !strings.Contains(st.Reason, "already fixed") {
		t.Errorf("state = %s %q", st.Status, st.Reason)
	}
}

func TestGate(t *testing.T) {
	// Held tasks are probed only by the block streak here: one probe of
	// the held an hour after the type's newest failure.
	e := newEnv(t, fail, &policy.File{Defaults: policy.Type{ProbeInterval: policy.Duration(time.Hour)}})
	e.start()
	run := func(taskType string, n int) {
		t.Helper()
		for i := range n {
			id := fmt.Sprintf("%s-%d", strings.ReplaceAll(taskType, "_", "-"), i)
			e.submit(events.Submit{ID: id, Type: taskType, Subject: fmt.Sprintf("f%d.css", i), MaxRetries: 1})
			e.waitEnd(id)
		}
	}

	// Under 10 settled tasks nothing is gated (no other type to learn
	// from): ten failures in a row all run.
	run("css_fix", 10)
	if n := e.model.Calls(); n != 10 {
		t.Fatalf("model calls = %d, want 10 (nothing gated under 10 outcomes)", n)
	}

	// Now css_fix scores 0: the next five are held, with the reason, no call.
	for i := range 5 {
		id := fmt.Sprintf("held-%d", i)
		e.submit(events.Submit{ID: id, Type: "css_fix", Subject: "x.css", MaxRetries: 1})
		e.waitStage(id, events.StageHeld)
		st := e.state(id)
		if st.Status != events.StatusHeld || st.Reason != "Blocked: css_fix trust score 0.00 below 0.15" {
			t.Fatalf("state = %s %q", st.Status, st.Reason)
		}
	}
	if got := len(e.reviews(events.ReviewGated)); got != 0 {
		t.Fatalf("%d held tasks went to a human before the hold time", got)
	}
	if e.model.Calls() != 10 {
		t.Fatalf("held tasks reached the model")
	}

	// The sixth after five blocks is let through as an exploration probe.
	e.submit(events.Submit{ID: "probe-1", Type: "css_fix", Subject: "x.css", MaxRetries: 1})
	all := e.waitEnd("probe-1")
	if timeline.Count(all, events.StageAdmitted) != 1 || !strings.Contains(string(all[2].Data), `"probe":true`) {
		t.Fatalf("probe not admitted as a probe: %v %s", timeline.Stages(all), all[2].Data)
	}
	// ...and the one after it is held again.
	e.submit(events.Submit{ID: "after-probe", Type: "css_fix", Subject: "x.css", MaxRetries: 1})
	e.waitStage("after-probe", events.StageHeld)

	// An exempt type is never gated, however badly it does.
	run("triage_fix", 12)
	if got := len(e.reviews(events.ReviewGated)); got != 0 {
		t.Fatalf("gated records = %d, want 0 (exempt type gated?)", got)
	}
}

func TestSecondPromptCarriesFirstAttempt(t *testing.T) {
	script := func(n int, _ openaitest.Request) openaitest.Reply {
		if n == 1 {
			return openaitest.Reply{Content: openaitest.Failure("null check in handleResponse()", "wrong location, the null comes from parsePayload()")}
		}
		return openaitest.Reply{Content: openaitest.Success("guard parsePayload()")}
	}
	e := newEnv(t, script, nil)
	e.start()
	id := e.submit(events.Submit{ID: "two-attempts", Type: "bug_fix", Subject: "src/api.ts"})
	if got := last(e.waitEnd(id)).Stage; got != events.StageSucceeded {
		t.Fatalf("ended with %s", got)
	}
	reqs := e.model.Requests()
	if len(reqs) != 2 {
		t.Fatalf("model calls = %d, want 2", len(reqs))
	}
	if strings.Contains(reqs[0].Messages[1].Content, "<previous_attempts>") {
		t.Errorf("first prompt has previous attempts")
	}
	second := reqs[1].Messages[1].Content
	for _, want := range []string{"<previous_attempts>", `outcome="failure"`, "null check in handleResponse()", "parsePayload()"} {
		if !strings.Contains(second, want) {
			t.Errorf("second prompt lacks %q:\n%s", want, second)
		}
	}
	if st := e.state(id); st.Attempts != 2 || st.Status != events.StatusSucceeded {
		t.Errorf("state = %+v", st)
	}
}

func TestSameIDTwiceMakesOneTask(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start()
	e.submit(events.Submit{ID: "once", Type: "css_fix", Subject: "a.css"})
	e.submit(events.Submit{ID: "once", Type: "css_fix", Subject: "a.css"})
	e.waitEnd("once")
	// A third task after both makes sure intake handled the duplicate before we count.
	e.submit(events.Submit{ID: "marker", Type: "css_fix", Subject: "a.css"})
	e.waitEnd("marker")
	all := e.events("once")
	if timeline.Count(all, events.StageVerified) != 1 || timeline.Count(all, events.StageSucceeded) != 1 {
		t.Fatalf("events of a task submitted twice: %v", timeline.Stages(all))
	}
	if e.model.Calls() != 2 {
		t.Fatalf("model calls = %d, want 2", e.model.Calls())
	}
}

func TestBadInputIsAnsweredAndKept(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start()
	cases := []struct {
		name, subjectType string
		data              []byte
		want              string
	}{
		{"malformed", "css_fix", []byte(`{"subject": "a.css",`), "malformed JSON"},
		{"wrong-typed", "css_fix", []byte(`{"id":"wt-1","subject":"a.css","max_retries":"three"}`), `"max_retries"`},
		{"oversized", "css_fix", []byte(`{"subject":"a.css","payload":"` + strings.Repeat("x", events.MaxSubmitBytes) + `"}`), "limit"},
		{"missing subject", "css_fix", []byte(`{"id":"ms-1"}`), `"subject" is required`},
	}
	for _, c := range cases {
		e.submitRaw(c.subjectType, c.data)
	}
	got := e.waitReviews(events.ReviewRejected, len(cases))
	for _, c := range cases {
		var kept *nats.Msg
		for _, m := range got {
			if bytes.Equal(m.Data, c.data) {
				kept = m
			}
		}
		if kept == nil {
			t.Errorf("%s: original bytes not kept on review", c.name)
			continue
		}
		if why := kept.Header.Get(events.HeaderError); !strings.Contains(why, c.want) {
			t.Errorf("%s: error %q does not mention %q", c.name, why, c.want)
		}
		if c.name == "wrong-typed" && !strings.HasSuffix(kept.Subject, ".wt-1") {
			t.Errorf("a rejected task with a valid id is not filed under it: %s", kept.Subject)
		}
	}
	// The mesh is still alive.
	e.submit(events.Submit{ID: "after-bad", Type: "css_fix", Subject: "a.css"})
	if s := last(e.waitEnd("after-bad")).Stage; s != events.StageSucceeded {
		t.Fatalf("after bad input a good task ended with %s", s)
	}
}

// A service that dies holding a message: the message is redelivered to
// another instance and the task completes once.
func TestKilledExecutorMessageIsRedelivered(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.model.Started = make(chan openaitest.Request, 4)
	e.model.Block = make(chan struct{})
	e.start(services.ConsumerIntake, services.ConsumerVerifier, services.ConsumerGate, services.ConsumerPrompt, services.ConsumerRecorder)
	victim, _ := e.srv.Connect(t)
	stopVictim := e.startOn(victim, services.ConsumerExecutor)

	e.submit(events.Submit{ID: "crash-1", Type: "css_fix", Subject: "a.css"})
	<-e.model.Started // the victim holds the message, mid model call
	victim.Close()    // crash: no ack, no nak
	close(e.model.Block)
	stopVictim()

	e.start(services.ConsumerExecutor) // a fresh instance picks it up after AckWait
	all := e.waitEnd("crash-1")
	if got := last(all).Stage; got != events.StageSucceeded {
		t.Fatalf("ended with %s", got)
	}
	if n := timeline.Count(e.events("crash-1"), events.StageExecuted); n != 1 {
		t.Fatalf("%d executed events, want exactly 1", n)
	}
	if st := e.state("crash-1"); st.Attempts != 1 || len(st.History) != 1 {
		t.Fatalf("recorded %d attempts", len(st.History))
	}
}

// Many recorders recording outcomes of one type at once lose no update: the
// outcome stream holds each outcome once.
func TestConcurrentOutcomesKeepTrustExact(t *testing.T) {
	e := newEnv(t, func(n int, _ openaitest.Request) openaitest.Reply {
		if n%2 == 0 {
			return openaitest.Reply{Content: openaitest.Failure("a", "b")}
		}
		return succeed(n, openaitest.Request{})
	}, nil)
	e.start(services.ConsumerIntake, services.ConsumerVerifier, services.ConsumerGate, services.ConsumerPrompt, services.ConsumerExecutor)
	for range 3 {
		e.start(services.ConsumerRecorder)
	}
	const tasks = 40
	var wg sync.WaitGroup
	for i := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.submit(events.Submit{ID: fmt.Sprintf("c-%d", i), Type: "triage_fix", Subject: fmt.Sprintf("s%d", i), MaxRetries: 1})
		}()
	}
	wg.Wait()
	for i := range tasks {
		e.waitEnd(fmt.Sprintf("c-%d", i))
	}
	view, err := trust.NewView(context.Background(), e.srv.JS, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Stop()
	stats := view.Stats("triage_fix")
	if ok, failed := stats.Counts(); ok+failed != tasks || ok != e.model.Calls()-failed {
		t.Fatalf("trust window %d/%d after %d outcomes", ok, failed, tasks)
	}
}
