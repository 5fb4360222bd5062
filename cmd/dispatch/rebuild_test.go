package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Issue 9 end to end: a task whose queued event no later stage can decode
// (what an intake without a depth limit made of a payload nested 9,999
// levels deep) is dead-lettered by the verifier. Review lists it and can
// act on it; rebuild reports that one event and replays the rest.
func TestUndecodableEventIsReviewableAndRebuildSkipsIt(t *testing.T) {
	m := reviewtest.Start(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("fixed")}
	}, reviewtest.Options{})
	c := newCLI(t, m)
	m.Submit(events.Submit{ID: "fine-1", Type: "css_fix", Subject: "a.css"})
	m.WaitStage("fine-1", events.StageSucceeded, 1)

	injectUndecodableTask(t, m, "deep-1")
	m.WaitStage("deep-1", "review.poison", 1)

	out, err := c.run("rebuild")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), "1 events could not be decoded and were skipped") {
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
	for _, want := range []string{"replayed ", "skipped (undecodable): dispatch.task.deep-1.queued (seq ", "exceeded max depth"} {
		if !strings.Contains(out, want) {
			t.Errorf("rebuild output lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "differs:") && !strings.Contains(line, "deep-1") {
			t.Errorf("the rest of the stream was not replayed as it was: %s\n%s", line, out)
		}
	}
	out, err = c.run("rebuild", "-o", "json")
	var report struct {
		Skipped []struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Error   string `json:"error"`
		} `json:"skipped"`
	}
	if jerr := json.Unmarshal([]byte(out), &report); jerr != nil || err == nil || len(report.Skipped) != 1 ||
		report.Skipped[0].Subject != events.TaskSubject("deep-1", events.StageQueued) || report.Skipped[0].Seq == 0 {
		t.Fatalf("rebuild -o json: %v, %v\n%s", err, jerr, out)
	}

	show := c.ok("review", "show", "deep-1")
	for _, want := range []string{"stopped by poison: undecodable dispatch.task.deep-1.queued", "resolve, reject (dispatch review", "requeue  not possible"} {
		if !strings.Contains(show, want) {
			t.Errorf("review show lacks %q:\n%s", want, show)
		}
	}
	if _, err := c.run("review", "requeue", "deep-1", "-note", "again"); err == nil || !strings.Contains(err.Error(), "cannot requeue task deep-1: none of its events") {
		t.Fatalf("requeue: %v", err)
	}
	c.ok("review", "resolve", "deep-1", "-note", "fixed the payload by hand")
	if st := m.State("deep-1"); st.Status != events.StatusSucceeded {
		t.Fatalf("after resolve: %s", st.Status)
	}
}

// injectUndecodableTask does what intake did before it checked nesting:
// create the task, then publish its queued event — here nested 10,001
// levels deep, past what Go's decoder accepts — without Dispatch-Pass, as
// events were then.
func injectUndecodableTask(t *testing.T, m *reviewtest.Mesh, id string) {
	t.Helper()
	ctx := context.Background()
	tk := events.Task{ID: id, Type: "css_fix", Subject: "a.css", SubmittedAt: time.Now().UTC()}
	if _, _, err := m.Tasks.Create(ctx, task.New(tk)); err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat("[", 9999) + strings.Repeat("]", 9999)
	msg := nats.NewMsg(events.TaskSubject(id, events.StageQueued))
	msg.Header.Set(events.HeaderEvent, events.EventQueued)
	msg.Header.Set(events.HeaderTaskID, id)
	msg.Data = []byte(`{"task":{"id":"` + id + `","type":"css_fix","subject":"a.css","payload":` + deep + `},"run":{"pass":1,"attempt":1}}`)
	if _, err := m.Srv.JS.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
}

// The outcome stream, the history bucket and the gate's facts are derived
// stores too: a missing outcome, a foreign one, a lost failure, a record
// of the former history layout and a block streak nobody decided are
// found, -apply restores them (the canary places the gate holds are left
// as they are, being nothing events imply), and a second -apply finds
// nothing to rewrite.
func TestRebuildRestoresTheOutcomeStreamAndHistory(t *testing.T) {
	m := reviewtest.Start(t, func(_ int, r openaitest.Request) openaitest.Reply {
		if strings.Contains(r.Messages[1].Content, "hard") {
			return openaitest.Reply{Content: openaitest.Failure("an idea", "nope")}
		}
		return openaitest.Reply{Content: openaitest.Success("fixed")}
	}, reviewtest.Options{Policy: &policy.File{Types: map[string]policy.Type{"triage_fix": {MaxRetries: 2}}}})
	c := newCLI(t, m)
	for i, subject := range []string{"a.go", "hard.go", "a.go", "hard.go"} {
		id := fmt.Sprintf("rs-%d", i)
		m.Submit(events.Submit{ID: id, Type: "triage_fix", Subject: subject, Payload: []byte(`{"what":"` + subject + `"}`)})
		if subject == "hard.go" {
			m.WaitStage(id, "review."+events.ReviewEscalated, 1)
		} else {
			m.WaitStage(id, events.StageSucceeded, 1)
		}
	}
	if out := c.ok("rebuild"); !strings.Contains(out, "the live stores agree with the stream") {
		t.Fatalf("rebuild after a normal run:\n%s", out)
	}

	ctx := context.Background()
	js := m.Srv.JS
	outcomes, err := js.Stream(ctx, trust.OutcomeStream)
	if err != nil {
		t.Fatal(err)
	}
	first, err := outcomes.GetLastMsgForSubject(ctx, trust.OutcomeSubject("triage_fix"))
	if err != nil {
		t.Fatal(err)
	}
	if err := outcomes.DeleteMsg(ctx, first.Sequence); err != nil { // an outcome lost
		t.Fatal(err)
	}
	foreign, err := trust.OutcomeMsg("triage_fix", trust.Outcome{Key: "nobody:1:outcome", Success: true, At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, foreign); err != nil { // an outcome no event implies
		t.Fatal(err)
	}
	histKV, err := js.KeyValue(ctx, services.BucketHistory)
	if err != nil {
		t.Fatal(err)
	}
	hist := history.NewStore(histKV)
	hard, err := hist.Recent(ctx, "triage_fix", "hard.go")
	if err != nil || len(hard.Failures) == 0 {
		t.Fatalf("history of hard.go: %+v %v", hard, err)
	}
	lost := hard.Failures[len(hard.Failures)-1].Key
	hard.Failures = hard.Failures[:len(hard.Failures)-1]
	if err := hist.Put(ctx, hard); err != nil { // a failure lost
		t.Fatal(err)
	}
	easy, err := hist.Recent(ctx, "triage_fix", "a.go")
	if err != nil || len(easy.Outcomes) == 0 {
		t.Fatalf("history of a.go: %+v %v", easy, err)
	}
	old, _ := json.Marshal(map[string]any{"type": easy.Type, "subject": easy.Subject, "entries": easy.Outcomes})
	if _, err := histKV.Put(ctx, history.Key("triage_fix", "a.go"), old); err != nil { // the former layout
		t.Fatal(err)
	}
	facts, err := js.KeyValue(ctx, services.BucketTrust)
	if err != nil {
		t.Fatal(err)
	}
	canaries := []trust.Canary{{Key: "rs-9", At: time.Now().UTC().Truncate(time.Second)}}
	tampered, _ := json.Marshal(trust.Stats{Type: "triage_fix", BlockStreak: 3, Canaries: canaries})
	if _, err := facts.Put(ctx, "triage_fix", tampered); err != nil {
		t.Fatal(err)
	}

	out, err := c.run("rebuild")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("rebuild of tampered stores: %v\n%s", err, out)
	}
	for _, want := range []string{
		"differs: " + rebuild.StoreOutcomes + " triage_fix: outcomes live=",
		"only here: nobody:1:outcome",
		"differs: " + services.BucketHistory + " " + history.Key("triage_fix", "hard.go") + ": failures live=",
		"only here: " + lost,
		"differs: " + services.BucketHistory + " " + history.Key("triage_fix", "a.go") + ": entries live=",
		"differs: " + services.BucketTrust + " triage_fix: (entry) live=present rebuilt=missing", // a streak no gate decision implies
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rebuild output lacks %q:\n%s", want, out)
		}
	}
	if out := c.ok("rebuild", "-apply"); !strings.Contains(out, "live stores overwritten") {
		t.Fatalf("rebuild -apply:\n%s", out)
	}
	if out := c.ok("rebuild"); !strings.Contains(out, "the live stores agree with the stream") {
		t.Fatalf("rebuild after -apply:\n%s", out)
	}
	var kept trust.Stats
	if e, err := facts.Get(ctx, "triage_fix"); err != nil || json.Unmarshal(e.Value(), &kept) != nil ||
		kept.BlockStreak != 0 || !slices.Equal(kept.Canaries, canaries) {
		t.Fatalf("gate facts after -apply: %+v (%v); want streak 0 and the canary places kept", kept, err)
	}

	if rec, err := hist.Recent(ctx, "triage_fix", "hard.go"); err != nil ||
		!slices.ContainsFunc(rec.Failures, func(e history.Entry) bool { return e.Key == lost }) {
		t.Fatalf("history of hard.go after -apply: %+v %v; want %s among its failures", rec, err, lost)
	}

	// Applied again: nothing left to rewrite on the outcome stream or in
	// the history bucket.
	before := streamStates(t, js)
	c.ok("rebuild", "-apply")
	if after := streamStates(t, js); after != before {
		t.Fatalf("a second -apply rewrote the stores: %s, then %s", before, after)
	}
}

// streamStates is the last sequence and message count of the outcome
// stream and of the history bucket's stream.
func streamStates(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	var parts []string
	for _, name := range []string{trust.OutcomeStream, "KV_" + services.BucketHistory} {
		s, err := js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		st := s.CachedInfo().State
		parts = append(parts, fmt.Sprintf("%s last %d, %d messages", name, st.LastSeq, st.Msgs))
	}
	return strings.Join(parts, "; ")
}
