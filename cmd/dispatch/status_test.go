package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
)

// status -v prints the payload and every attempt's answer, as the task
// page shows them; -o json carries them too; without -v neither.
func TestStatusVerbosePrintsPayloadAndAnswers(t *testing.T) {
	m := reviewtest.Start(t, func(n int, _ openaitest.Request) openaitest.Reply {
		if n == 1 {
			return openaitest.Reply{Content: openaitest.Failure("margin hack", "still misaligned"), TokensIn: 120, TokensOut: 30}
		}
		return openaitest.Reply{Content: openaitest.Success("flexbox on the parent"), TokensIn: 140, TokensOut: 40}
	}, reviewtest.Options{})
	c := newCLI(t, m)
	m.Submit(events.Submit{ID: "v-1", Type: "css_fix", Subject: "src/app.css", Payload: json.RawMessage(`{"issue":"button misaligned","line":42}`)})
	m.WaitStage("v-1", events.StageSucceeded, 1)

	out := c.ok("status", "-v", "v-1")
	for _, want := range []string{
		"succeeded", "attempts   2", // the state, as without -v
		"PAYLOAD", `"issue": "button misaligned"`, `"line": 42`,
		"WHAT THE MODEL ANSWERED",
		"attempt 1  pass 1  REFINE execute  failure", "120/30 tokens", "approach: margin hack", "summary: still misaligned",
		"attempt 2  pass 2", "success", "140/40 tokens", "approach: flexbox on the parent", "summary: done", "change: a change",
		"took ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status -v lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "attempt 1  pass 1") > strings.Index(out, "attempt 2  pass 2") {
		t.Errorf("answers out of order:\n%s", out)
	}
	if plain := c.ok("status", "v-1"); strings.Contains(plain, "PAYLOAD") || strings.Contains(plain, "margin hack\n") {
		t.Errorf("status without -v prints the story:\n%s", plain)
	}

	var v struct {
		ID      string `json:"id"`
		Status  string `json:"status"`
		Payload struct {
			Issue string `json:"issue"`
		} `json:"payload"`
		Answers []struct {
			Attempt    int      `json:"attempt"`
			Pass       int      `json:"pass"`
			Outcome    string   `json:"outcome"`
			Approach   string   `json:"approach"`
			Summary    string   `json:"summary"`
			Changes    []string `json:"changes"`
			Model      string   `json:"model"`
			TokensIn   int      `json:"tokens_in"`
			TokensOut  int      `json:"tokens_out"`
			DurationMS *int64   `json:"duration_ms"`
		} `json:"answers"`
		Result *struct {
			Summary string `json:"summary"`
		} `json:"result"`
	}
	raw := c.ok("status", "v-1", "-v", "-o", "json")
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
	if v.ID != "v-1" || v.Status != "succeeded" || v.Payload.Issue != "button misaligned" || v.Result == nil || v.Result.Summary != "done" || len(v.Answers) != 2 {
		t.Fatalf("status -v -o json:\n%s", raw)
	}
	a, b := v.Answers[0], v.Answers[1]
	if a.Attempt != 1 || a.Outcome != "failure" || a.Approach != "margin hack" || a.TokensIn != 120 || a.Model == "" || a.DurationMS == nil ||
		b.Attempt != 2 || b.Pass != 2 || b.Outcome != "success" || b.Summary != "done" || len(b.Changes) != 1 || b.TokensOut != 40 {
		t.Fatalf("answers: %+v\n%s", v.Answers, raw)
	}
	if raw := c.ok("status", "v-1", "-o", "json"); strings.Contains(raw, `"answers"`) || strings.Contains(raw, `"payload"`) {
		t.Errorf("status -o json without -v carries the story:\n%s", raw)
	}
}
