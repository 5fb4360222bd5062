package prompt

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
)

func TestFitPast(t *testing.T) {
	fail := func(n int, approach, errText string) history.Entry {
		e := entry(n, events.OutcomeFailure, approach, "", errText)
		e.TaskID = fmt.Sprintf("t%d", n)
		return e
	}
	ok := func(n int, approach string) history.Entry {
		return entry(n, events.OutcomeSuccess, approach, "done", "")
	}
	long := strings.Repeat("stack frame at handler.go:42\n", 200) // ≈ 5,800 characters
	approaches := func(es []history.Entry) string {
		var s []string
		for _, e := range es {
			s = append(s, e.Approach)
		}
		return strings.Join(s, ",")
	}
	tests := []struct {
		name     string
		run      events.Run
		previous []history.Entry
		budget   int
		check    func(t *testing.T, p past)
	}{
		{
			name:     "a subject that never failed carries no history",
			run:      events.Run{Attempt: 1, Rung: events.RungRefine},
			previous: []history.Entry{ok(1, "a"), ok(2, "b")},
			check: func(t *testing.T, p past) {
				if p.previous != nil {
					t.Errorf("previous = %v", approaches(p.previous))
				}
			},
		},
		{
			name:     "failures newest first, the newest success only, chronological in the prompt",
			run:      events.Run{Attempt: 1, Rung: events.RungRefine},
			previous: []history.Entry{ok(1, "old fix"), fail(2, "x", "e2"), ok(3, "new fix"), fail(4, "y", "e4")},
			check: func(t *testing.T, p past) {
				if got := approaches(p.previous); got != "x,new fix,y" {
					t.Errorf("previous = %s", got)
				}
			},
		},
		{
			name:     "an approach listed as a dead end is not repeated",
			run:      events.Run{Attempt: 3, Rung: events.RungPivot, DeadEnds: []events.DeadEnd{{Approach: "Null check!", Reason: "wrong place", Attempt: 1}}},
			previous: []history.Entry{fail(1, "null check", "wrong place"), fail(2, "guard async path", "missed it")},
			check: func(t *testing.T, p past) {
				if got := approaches(p.previous); got != "guard async path" || len(p.deadEnds) != 1 {
					t.Errorf("previous = %s, dead ends = %v", got, p.deadEnds)
				}
			},
		},
		{
			name: "the same dead end once, newest kept",
			run: events.Run{Attempt: 4, Rung: events.RungPivot, DeadEnds: []events.DeadEnd{
				{Approach: "retry it", Attempt: 1}, {Approach: "other", Attempt: 2}, {Approach: "Retry it.", Attempt: 3}}},
			check: func(t *testing.T, p past) {
				if len(p.deadEnds) != 2 || p.deadEnds[0].Attempt != 2 || p.deadEnds[1].Attempt != 3 {
					t.Errorf("dead ends = %+v", p.deadEnds)
				}
			},
		},
		{
			name: "a dead end's reason that is the last error is said once",
			run: events.Run{Attempt: 3, Rung: events.RungPivot, Context: "the parser still rejects the input", DeadEnds: []events.DeadEnd{
				{Approach: "patch the lexer", Reason: "tokens lost", Attempt: 1}, {Approach: "patch the parser", Reason: "the parser  still rejects\nthe input", Attempt: 2}}},
			check: func(t *testing.T, p past) {
				if len(p.deadEnds) != 2 || p.deadEnds[0].Reason != "tokens lost" || p.deadEnds[1].Reason != "" {
					t.Errorf("dead ends = %+v", p.deadEnds)
				}
				if len(p.enforced) != 2 || p.enforced[1].Reason == "" { // judged whole
					t.Errorf("enforced = %+v", p.enforced)
				}
			},
		},
		{
			name:     "the last error is said once",
			run:      events.Run{Attempt: 2, Rung: events.RungRefine, Context: "HTTP 400: bad selector"},
			previous: []history.Entry{fail(1, "inline style", "HTTP 400:  bad selector")},
			check: func(t *testing.T, p past) {
				if len(p.previous) != 1 || p.previous[0].Error != "" || p.previous[0].Approach != "inline style" {
					t.Errorf("previous = %+v", p.previous)
				}
			},
		},
		{
			name: "an error that recurs with another number is said once",
			run: events.Run{Attempt: 4, Rung: events.RungResearch, Context: "the upstream dependency is broken (try 3)", DeadEnds: []events.DeadEnd{
				{Approach: "rework, variant 1", Reason: "the upstream dependency is broken (try 1)", Attempt: 1},
				{Approach: "lint first", Reason: "HTTP 404", Attempt: 2},
				{Approach: "rework, variant 2", Reason: "The upstream dependency is broken! (try 2)", Attempt: 3}}},
			check: func(t *testing.T, p past) {
				var reasons []string
				for _, d := range p.deadEnds {
					reasons = append(reasons, d.Reason)
				}
				if got := strings.Join(reasons, "|"); got != "|HTTP 404|" {
					t.Errorf("dead ends' reasons = %q", got)
				}
			},
		},
		{
			name: "a previous attempt says what is not said yet",
			run:  events.Run{Attempt: 4, Rung: events.RungRefine, Context: "the request timed out after 30s"},
			previous: []history.Entry{
				entry(1, events.OutcomeFailure, "a", "exit status 1", "exit status 1"),
				entry(2, events.OutcomeFailure, "b", "exit status 2", "exit status 2"),
				entry(3, events.OutcomeFailure, "c", "the request timed out after 12s", "the request timed out after 12s")},
			check: func(t *testing.T, p past) {
				if len(p.previous) != 3 || p.previous[2].Error != "" || p.previous[2].Summary != "" || p.previous[1].Error != "exit status 2" || p.previous[0].Error != "exit status 1" {
					t.Errorf("previous = %+v", p.previous)
				}
			},
		},
		{
			name:   "a long error is clipped at both ends within the budget",
			run:    events.Run{Attempt: 2, Rung: events.RungRefine, Context: "panic: nil map\n" + long + "exit status 2"},
			budget: 100,
			check: func(t *testing.T, p past) {
				if len(p.lastError) > 200 || !strings.HasPrefix(p.lastError, "panic: nil map") || !strings.HasSuffix(p.lastError, "exit status 2") {
					t.Errorf("last error (%d bytes) = %q", len(p.lastError), p.lastError)
				}
			},
		},
		{
			name:     "many failures: newest first until the budget is spent",
			run:      events.Run{Attempt: 1, Rung: events.RungRefine},
			previous: manyFailures(40),
			budget:   200,
			check: func(t *testing.T, p past) {
				n := len(p.previous)
				if n == 0 || n == 40 || p.previous[n-1].Approach != "approach 40" {
					t.Errorf("%d kept, newest %q", n, p.previous[n-1].Approach)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fitPast(tt.run, tt.previous, tt.budget)
			tt.check(t, p)
			budget := tt.budget
			if budget == 0 {
				budget = DefaultPromptBudget
			}
			if n := injectedChars(p); n > budget*charsPerToken {
				t.Errorf("%d characters injected, budget %d", n, budget*charsPerToken)
			}
		})
	}
}

// injectedChars is what the default template renders of p.
func injectedChars(p past) int {
	d := Data{Context: p.lastError, Note: p.note, DeadEnds: FormatDeadEnds(p.deadEnds), PreviousAttempts: history.Format(p.previous)}
	return len(d.Context) + len(d.Note) + len(d.DeadEnds) + len(d.PreviousAttempts)
}

func manyFailures(n int) []history.Entry {
	var out []history.Entry
	for i := 1; i <= n; i++ {
		out = append(out, entry(i, events.OutcomeFailure, fmt.Sprintf("approach %d", i), "it did not work at all", fmt.Sprintf("error number %d", i)))
	}
	return out
}

func TestClip(t *testing.T) {
	for _, tt := range []struct {
		s string
		n int
	}{{"short", 10}, {strings.Repeat("é", 100), 51}, {strings.Repeat("ab", 100), 40}, {"x", 0}, {strings.Repeat("日本", 30), 10}} {
		got := clip(tt.s, tt.n)
		if len(got) > max(tt.n, 0) && len(tt.s) > tt.n || !utf8.ValidString(got) {
			t.Errorf("clip(%q, %d) = %q", tt.s, tt.n, got)
		}
	}
}

// TestClipEntry: an entry says each text once, even when the longer one
// has to be clipped, and names no default step.
func TestClipEntry(t *testing.T) {
	long := "the handler was not the cause; the crash comes from a stale cache entry in the loader, look there first " +
		strings.Repeat("(detail) ", 60)
	tests := []struct {
		name                   string
		in                     history.Entry
		summary, errText, step string
	}{
		{"summary is the error", history.Entry{Summary: "disk full", Error: "disk full"}, "", "disk full", ""},
		{"summary is the error, too long to fit twice", history.Entry{Approach: strings.Repeat("a", maxLineChars/3), Summary: long[:maxLineChars/2], Error: long[:maxLineChars/2]},
			"", strings.TrimSpace(long[:maxLineChars/2]), ""},
		{"error inside the summary", history.Entry{Summary: "tests fail: disk full on /tmp", Error: "disk full"}, "tests fail: disk full on /tmp", "", ""},
		{"both, different", history.Entry{Summary: "tried the cache", Error: "timeout"}, "tried the cache", "timeout", ""},
		{"multi-line texts compared as one line", history.Entry{Summary: "a\n  b", Error: "x a b y"}, "", "x a b y", ""},
		{"the default step is not named", history.Entry{Step: events.StepExecute, Error: "e"}, "", "e", ""},
		{"a pipeline's step is", history.Entry{Step: "review", Error: "e"}, "", "e", "review"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := clipEntry(tt.in)
			if got.Summary != tt.summary || got.Error != tt.errText || got.Step != tt.step {
				t.Errorf("clipEntry = summary %q, error %q, step %q; want %q, %q, %q", got.Summary, got.Error, got.Step, tt.summary, tt.errText, tt.step)
			}
		})
	}
}
