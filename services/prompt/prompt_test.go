package prompt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// fakeHistory serves fixed entries and records what it was asked.
type fakeHistory struct {
	mu      sync.Mutex
	entries []history.Entry
	err     error
	asked   []string
}

// Recent keeps what the history keeps of entries: the last Keep outcomes,
// and the last Keep failures.
func (f *fakeHistory) Recent(ctx context.Context, taskType, subject string) (history.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, fmt.Sprintf("%s|%s", taskType, subject))
	rec := history.Record{Type: taskType, Subject: subject}
	if f.err != nil {
		return rec, f.err
	}
	for _, e := range f.entries {
		rec, _ = rec.Add(e)
	}
	return rec, nil
}

var now = time.Date(2026, 5, 20, 8, 0, 0, 0, time.UTC)

func newService(t *testing.T, cfg Config) *Service {
	t.Helper()
	if cfg.History == nil {
		cfg.History = &fakeHistory{}
	}
	cfg.Now = func() time.Time { return now }
	if cfg.Instance == "" {
		cfg.Instance = "prompt@test"
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func admittedMsg(t testing.TB, b events.Base) *services.Msg {
	t.Helper()
	data, err := json.Marshal(events.Admitted{Base: b, Trust: events.TrustDecision{Score: 0.9, Outcomes: 12, Threshold: 0.15}})
	if err != nil {
		t.Fatal(err)
	}
	return &services.Msg{Subject: events.TaskSubject(b.Task.ID, events.StageAdmitted), Data: data, Delivered: 1}
}

// handle runs Handle and decodes its one output.
func handle(t *testing.T, s *Service, b events.Base) (services.Out, events.Prompted) {
	t.Helper()
	outs, err := s.Handle(context.Background(), admittedMsg(t, b))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if len(outs) != 1 {
		t.Fatalf("Handle returned %d outputs, want 1", len(outs))
	}
	var p events.Prompted
	if err := json.Unmarshal(outs[0].Data, &p); err != nil {
		t.Fatalf("decode Prompted: %v", err)
	}
	return outs[0], p
}

func TestHandle(t *testing.T) {
	h := &fakeHistory{entries: []history.Entry{
		entry(1, "failure", "a1", "s1", "e1"), entry(2, "failure", "a2", "s2", "e2"),
		entry(3, "failure", "a3", "s3", "e3"), entry(4, "failure", "a4", "s4", "e4"),
		entry(5, "failure", "a5", "s5", "e5"), entry(6, "failure", "a6", "s6", "e6"),
	}}
	s := newService(t, Config{History: h})
	b := testBase()
	b.Run = events.Run{Pass: 7, Attempt: 7, Rung: RungPivot, Step: "execute", Context: "still overflowing"}
	out, p := handle(t, s, b)

	if out.Subject != events.TaskSubject("t1", events.StagePrompted) || out.MsgID != services.MsgID("t1", 7, events.StagePrompted) {
		t.Errorf("subject %q, msg id %q", out.Subject, out.MsgID)
	}
	if got := out.Header.Get(events.HeaderEvent); got != events.EventPrompted {
		t.Errorf("event header = %q", got)
	}
	if !p.At.Equal(now) || p.By != "prompt@test" || p.Task.ID != "t1" || !reflect.DeepEqual(p.Run, b.Run) {
		t.Errorf("base = %+v", p.Base)
	}
	if p.Prompt.Model != "" {
		t.Errorf("model = %q, want empty for the executor's default", p.Prompt.Model)
	}
	if len(h.asked) != 1 || h.asked[0] != "css_fix|src/app.css" {
		t.Errorf("history asked %v, want css_fix|src/app.css (once)", h.asked)
	}
	msgs := p.Prompt.Messages
	if len(msgs) != 2 || msgs[0].Content != RecordsPrompt { // it holds previous attempts
		t.Fatalf("messages = %+v", msgs)
	}
	es := parseUser(t, msgs[1].Content)
	if n := len(find(es, "attempt")); n != 5 {
		t.Errorf("%d attempts in the prompt, want the last 5", n)
	}
	if strings.Contains(msgs[1].Content, "s1") || !strings.Contains(msgs[1].Content, "s6") {
		t.Errorf("prompt does not hold the last 5 outcomes:\n%s", msgs[1].Content)
	}
	if len(find(es, "last_error")) != 1 || len(find(es, "instructions")) != 1 {
		t.Errorf("prompt lacks last_error or instructions:\n%s", msgs[1].Content)
	}

	// A redelivery republishes the same message.
	again, _ := handle(t, s, b)
	if again.MsgID != out.MsgID || string(again.Data) != string(out.Data) {
		t.Error("a redelivered message built a different output")
	}
}

func TestHandlePolicy(t *testing.T) {
	src := policy.Static(&policy.File{
		Defaults: policy.Type{Model: "default-model"},
		Types: map[string]policy.Type{
			"css_fix": {Model: "gpt-4o", Template: `Fix {{xml .Task.Subject}} for the {{.Run.Attempt}}. time.`},
			"broken":  {Template: `{{if}}`},
			"unknown": {Template: `{{.Nope}}`},
		},
	})
	s := newService(t, Config{Policy: src, HistoryN: 2, DefaultModel: "fallback"})

	_, p := handle(t, s, testBase())
	if p.Prompt.Model != "gpt-4o" || p.Prompt.Messages[1].Content != "Fix src/app.css for the 1. time." {
		t.Errorf("custom type: model %q, user %q", p.Prompt.Model, p.Prompt.Messages[1].Content)
	}

	b := testBase()
	b.Task.Type = "other"
	_, p = handle(t, s, b)
	if p.Prompt.Model != "default-model" || !strings.HasPrefix(p.Prompt.Messages[1].Content, `<task type="other"`) {
		t.Errorf("default type: model %q, user %q", p.Prompt.Model, p.Prompt.Messages[1].Content)
	}

	for _, typ := range []string{"broken", "unknown"} {
		b.Task.Type = typ
		_, err := s.Handle(context.Background(), admittedMsg(t, b))
		var dead *services.DeadError
		if err == nil || !strings.Contains(err.Error(), `"`+typ+`"`) || errors.As(err, &dead) {
			t.Errorf("type %s: err = %v, want a plain error naming the type", typ, err)
		}
	}
}

// RESEARCH asks for research with the tools offered — and, for a type
// that offers none, for working out what the failures show was not known.
func TestResearchInstructionsFollowTheTools(t *testing.T) {
	src := policy.Static(&policy.File{Types: map[string]policy.Type{
		"with_tools": {ResearchTools: []policy.Tool{{Name: "search", Subject: "tools.search"}}},
	}})
	s := newService(t, Config{Policy: src})
	for typ, want := range map[string]string{"with_tools": RungInstructions(events.RungResearch), "css_fix": researchWithoutTools} {
		b := testBase()
		b.Task.Type = typ
		b.Run = events.Run{Pass: 5, Attempt: 5, Rung: events.RungResearch, Step: "execute"}
		_, p := handle(t, s, b)
		es := parseUser(t, p.Prompt.Messages[1].Content)
		if got := find(es, "instructions"); len(got) != 1 || !strings.Contains(p.Prompt.Messages[1].Content, escape(want)) {
			t.Errorf("type %s: instructions %v, want %q", typ, got, want)
		}
	}
}

func TestHandleDefaultModel(t *testing.T) {
	s := newService(t, Config{DefaultModel: "fallback"})
	if _, p := handle(t, s, testBase()); p.Prompt.Model != "fallback" {
		t.Errorf("model = %q, want fallback", p.Prompt.Model)
	}
}

func TestHandleErrors(t *testing.T) {
	boom := errors.New("kv down")
	s := newService(t, Config{History: &fakeHistory{err: boom}})
	_, err := s.Handle(context.Background(), admittedMsg(t, testBase()))
	if !errors.Is(err, boom) {
		t.Errorf("history error: err = %v, want it wrapped", err)
	}
	if _, snooze := services.IsSnooze(err); snooze {
		t.Error("history error snoozed instead of being retried")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Handle(ctx, admittedMsg(t, testBase())); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v, want context.Canceled", err)
	}

	_, err = s.Handle(context.Background(), &services.Msg{Subject: "dispatch.task.x.admitted", Data: []byte(`{"task":`)})
	var dead *services.DeadError
	if !errors.As(err, &dead) || dead.Reason != events.ReviewPoison {
		t.Errorf("undecodable: err = %v, want dead poison", err)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "History") {
		t.Errorf("New without History: err = %v", err)
	}
	if _, err := New(Config{History: &fakeHistory{}, HistoryN: -1}); err == nil {
		t.Error("New accepted a negative HistoryN")
	}
	// The history keeps history.Keep outcomes and failures per subject.
	if _, err := New(Config{History: &fakeHistory{}, HistoryN: history.Keep + 1}); err == nil {
		t.Error("New accepted a HistoryN the history cannot serve")
	}
	if _, err := New(Config{History: &fakeHistory{}, Ladder: ladder.Config{RecurringFailures: history.Keep + 1}}); err == nil {
		t.Error("New accepted a recurring-failure count the history cannot serve")
	}
}

func TestHandleInvalidForHistory(t *testing.T) {
	s := newService(t, Config{History: &fakeHistory{err: fmt.Errorf("%w: bad type", history.ErrInvalid)}})
	_, err := s.Handle(context.Background(), admittedMsg(t, testBase()))
	var dead *services.DeadError
	if !errors.As(err, &dead) || dead.Reason != events.ReviewPoison {
		t.Errorf("err = %v, want dead poison", err)
	}
}

// A new task whose (type, subject) failed 3+ times in the last 7 days starts
// on PIVOT; older failures, fewer failures and retries do not.
func TestRecurringFailureStartRung(t *testing.T) {
	fails := func(ages ...time.Duration) []history.Entry {
		var es []history.Entry
		for i, age := range ages {
			es = append(es, history.Entry{Key: fmt.Sprint(i), Outcome: events.OutcomeFailure, At: now.Add(-age)})
		}
		return es
	}
	day := 24 * time.Hour
	oks := func(age time.Duration, n int) []history.Entry {
		var es []history.Entry
		for i := range n {
			es = append(es, history.Entry{Key: fmt.Sprint("ok", i), Outcome: events.OutcomeSuccess, At: now.Add(-age + time.Duration(i)*time.Minute)})
		}
		return es
	}
	cases := []struct {
		name string
		kept []history.Entry
		run  events.Run
		want events.Rung
	}{
		{"three recent failures", fails(day, 2*day, 3*day), events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}, events.RungPivot},
		{"two recent failures", fails(day, 2*day), events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}, events.RungRefine},
		{"one of three is older than 7 days", fails(day, 2*day, 8*day), events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}, events.RungRefine},
		{"a retry keeps its rung", fails(day, 2*day, 3*day), events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine}, events.RungRefine},
		// The last outcomes are all successes, but the failures before
		// them are recent: the failures, kept apart, tell.
		{"three recent failures behind five successes", append(fails(3*day, 3*day, 3*day), oks(day, 5)...),
			events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}, events.RungPivot},
		{"three old failures behind five successes", append(fails(9*day, 9*day, 9*day), oks(day, 5)...),
			events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}, events.RungRefine},
		// a type's own numbers: 2 failures within 1 day
		{"its type: two failures within a day", fails(time.Hour, 2*time.Hour), events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}, events.RungPivot},
		{"its type: two failures, one older than a day", fails(time.Hour, 2*day), events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}, events.RungRefine},
	}
	src := policy.Static(&policy.File{Types: map[string]policy.Type{
		"quick": {RecurringFailures: 2, RecurringWindow: policy.Duration(day)},
	}})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newService(t, Config{History: &fakeHistory{entries: c.kept}, Policy: src})
			b := events.Base{Task: events.Task{ID: "t1", Type: "bug_fix", Subject: "a.go", SubmittedAt: now}, Run: c.run}
			if strings.HasPrefix(c.name, "its type") {
				b.Task.Type = "quick"
			}
			_, p := handle(t, s, b)
			if p.Run.Rung != c.want {
				t.Fatalf("rung %s, want %s", p.Run.Rung, c.want)
			}
		})
	}
}

// A type's previous_attempts bounds how many of the subject's last
// outcomes its prompt shows.
func TestPreviousAttemptsPerType(t *testing.T) {
	h := &fakeHistory{entries: []history.Entry{
		entry(1, "failure", "a1", "s1", "e1"), entry(2, "failure", "a2", "s2", "e2"), entry(3, "failure", "a3", "s3", "e3"),
	}}
	src := policy.Static(&policy.File{Types: map[string]policy.Type{"brief": {PreviousAttempts: 1}}})
	s := newService(t, Config{History: h, Policy: src})
	for typ, want := range map[string]int{"brief": 1, "css_fix": 3} {
		b := testBase()
		b.Task.Type = typ
		_, p := handle(t, s, b)
		if n := len(find(parseUser(t, p.Prompt.Messages[1].Content), "attempt")); n != want {
			t.Errorf("type %s: %d previous attempts in the prompt, want %d", typ, n, want)
		}
	}
}

// The sealed state is relayed as it came; a prompt the seal would take over
// MaxSealedEvent goes without it (the executor then reads the state).
func TestHandleRelaysTheSeal(t *testing.T) {
	s := newService(t, Config{})
	sealed := &events.Sealed{Rev: 7, State: json.RawMessage(`{"id":"t1"}`), MAC: "bWFj"}
	prompted := func(payload int) events.Prompted {
		t.Helper()
		b := testBase()
		b.Task.Payload, _ = json.Marshal(strings.Repeat("x", payload))
		data, err := json.Marshal(events.Admitted{Base: b, Sealed: sealed})
		if err != nil {
			t.Fatal(err)
		}
		outs, err := s.Handle(context.Background(), &services.Msg{Subject: events.TaskSubject("t1", events.StageAdmitted), Data: data, Delivered: 1})
		if err != nil || len(outs) != 1 {
			t.Fatalf("Handle: %d outputs, %v", len(outs), err)
		}
		var p events.Prompted
		if err := json.Unmarshal(outs[0].Data, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := prompted(10); p.Sealed == nil || p.Sealed.Rev != 7 || string(p.Sealed.State) != `{"id":"t1"}` || p.Sealed.MAC != "bWFj" {
		t.Errorf("small prompt: sealed %+v, want it as it came", p.Sealed)
	}
	if p := prompted(MaxSealedEvent / 2); p.Sealed != nil {
		t.Errorf("a prompt over MaxSealedEvent carries the seal")
	}
}
