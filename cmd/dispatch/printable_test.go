package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

// Text from a model, a tool or a task reaches the reviewer's terminal with
// its control characters blanked: it cannot erase a line, hide itself or
// write to the clipboard (OSC 52).
func TestModelTextCannotDriveTheTerminal(t *testing.T) {
	const hostile = "escalated\x1b]52;c;cm0gLXJmIH4K\x07 boom\r\x1b[2Kall tests passed \x1b[8mhidden\x1b[0m"
	st := events.TaskState{ID: "t1", Type: "bug_fix", Subject: hostile, Status: events.StatusBlocked, Reason: hostile, LastError: hostile,
		History: []events.AttemptRecord{{Attempt: 1, Approach: hostile, Reason: hostile}}}
	var buf bytes.Buffer
	printDetail(&buf, review.Detail{ID: "t1", Task: &st, Why: hostile, Attempts: st.History,
		DeadEnds: []events.DeadEnd{{Attempt: 1, Approach: hostile, Reason: hostile}}})
	printAudit(&buf, review.Audit{ID: "t1", Task: &st})
	printOutcome(&buf, client.Outcome{Status: events.StatusFailed, Reason: hostile,
		Result: &client.Result{Approach: hostile, Summary: hostile + "\nsecond line", Changes: []string{hostile}}})
	if out := buf.String(); strings.ContainsAny(out, "\x1b\r\x07") {
		t.Fatalf("control characters reach the terminal: %q", out)
	}
	if got := oneLine("ééé", 3); got != "é…" {
		t.Errorf("oneLine cut %q, want it cut at a rune boundary", got)
	}
}
