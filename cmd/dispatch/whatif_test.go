package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/whatif"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
)

// dispatch whatif against a running mesh: under the policy in force the
// history is reproduced; under a ladder of one attempt the task that
// needed two goes to a human, and the text report says so.
func TestWhatIfCommand(t *testing.T) {
	m := reviewtest.Start(t, func(n int, _ openaitest.Request) openaitest.Reply {
		if n == 1 {
			return openaitest.Reply{Content: openaitest.Failure("first idea", "still broken")}
		}
		return openaitest.Reply{Content: openaitest.Success("fixed")}
	}, reviewtest.Options{Policy: &policy.File{}})
	c := newCLI(t, m)
	id := m.Submit(events.Submit{ID: "wi-1", Type: "css_fix", Subject: "src/app.css", Payload: json.RawMessage(`{}`)})
	m.WaitStage(id, events.StageSucceeded, 1)

	dir := t.TempDir()
	same := writeFile(t, dir, "same.json", `{"defaults": {}}`)
	var r whatif.Result
	if err := json.Unmarshal([]byte(c.ok("whatif", "-policy", same, "-o", "json")), &r); err != nil {
		t.Fatal(err)
	}
	if r.Tasks != 1 || r.Actual.Resolved != 1 || r.Actual.Attempts != 2 || r.Actual != r.WhatIf.Figures || len(r.Changed) != 0 {
		t.Fatalf("under the policy in force: %+v", r.Report)
	}
	short := writeFile(t, dir, "short.json", `{"defaults": {"max_retries": 1}}`)
	if err := json.Unmarshal([]byte(c.ok("whatif", "-policy", short, "-o", "json", "-type", "css_fix")), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Changed) != 1 || r.Changed[0].ID != id || r.Changed[0].WhatIf.Fate != "to_human" || r.WhatIf.Attempts != 1 || r.WhatIf.Tokens >= r.Actual.Tokens {
		t.Fatalf("under a ladder of one attempt: %+v", r.Report)
	}
	out := c.ok("whatif", "-policy", short)
	if !strings.Contains(out, "1 tasks change") || !strings.Contains(out, "wi-1 (css_fix): resolved by succeeded") {
		t.Fatalf("text report:\n%s", out)
	}
	if _, err := c.run("whatif"); err == nil {
		t.Fatal("whatif without -policy ran")
	}
	// The shadow policy in the bucket as the candidate, named by its revision.
	if _, err := c.run("whatif", "-shadow"); err == nil || !strings.Contains(err.Error(), "no shadow policy") {
		t.Fatalf("whatif -shadow without one: %v", err)
	}
	c.ok("policy", "shadow", short)
	if err := json.Unmarshal([]byte(c.ok("whatif", "-shadow", "-o", "json")), &r); err != nil {
		t.Fatal(err)
	}
	if r.PolicyRevision == 0 || len(r.Changed) != 1 || r.Changed[0].WhatIf.Fate != "to_human" {
		t.Fatalf("whatif -shadow: %+v", r.Report)
	}
}
