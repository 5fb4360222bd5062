package whatif

import (
	"fmt"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// history records tasks as a mesh under the default policy (its rung
// floor off: rung_floor 0) records them,
// one after the other: healthy ones succeed at once, hard ones fail n
// times then succeed, hopeless ones fail until the ladder ends (7). Few
// tasks per type: no type is scored on its own evidence (min_outcomes
// 10), so every pass is admitted.
type history struct {
	evs []Event
	at  time.Time
}

func (h *history) add(k Kind, b events.Base, res events.Result) {
	h.at = h.at.Add(time.Second)
	b.At = h.at
	h.evs = append(h.evs, Event{Kind: k, Base: b, Stored: h.at, Result: res,
		Trust: events.TrustDecision{Cause: events.CauseUnproven}})
}

// task records a task whose attempt i succeeds when ok(i), up to limit.
func (h *history) task(id, typ string, limit int, ok func(i int) bool) {
	t := events.Task{ID: id, Type: typ, Subject: "src/" + id}
	rungs := []events.Rung{events.RungRefine, events.RungRefine, events.RungPivot, events.RungPivot, events.RungResearch, events.RungPivot, events.RungPivot}
	h.add(KindQueued, events.Base{Task: t, Run: events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}}, events.Result{})
	for i := 1; i <= limit; i++ {
		b := events.Base{Task: t, Run: events.Run{Pass: i, Attempt: i, Rung: rungs[i-1]}}
		h.add(KindVerified, b, events.Result{})
		h.add(KindAdmitted, b, events.Result{})
		res := events.Result{Outcome: events.OutcomeFailure, Approach: fmt.Sprintf("approach %d", i), Error: "still broken", TokensIn: 100 * i, TokensOut: 10}
		if ok(i) {
			res = events.Result{Outcome: events.OutcomeSuccess, Approach: "fix", TokensIn: 100 * i, TokensOut: 10}
		}
		h.add(KindExecuted, b, res)
		switch {
		case ok(i):
			h.add(KindSucceeded, b, events.Result{})
			return
		case i == limit:
			h.add(KindEscalated, b, events.Result{})
			return
		}
		h.add(KindRetry, events.Base{Task: t, Run: events.Run{Pass: i + 1, Attempt: i + 1, Rung: rungs[i]}}, events.Result{})
	}
}

func recorded() []Event {
	h := &history{at: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	for i := range 4 {
		h.task(fmt.Sprintf("ok-%d", i), "healthy", 7, func(int) bool { return true })
		h.task(fmt.Sprintf("hard-%d", i), "hard", 7, func(n int) bool { return n == 2+i }) // succeeds on attempt 2..5
		h.task(fmt.Sprintf("never-%d", i), "hopeless", 7, func(int) bool { return false })
	}
	return h.evs
}

func parseFile(s string) (*policy.File, error) { return policy.Parse([]byte(s)) }

func parse(t *testing.T, s string) *policy.File {
	t.Helper()
	f, err := parseFile(s)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Under the policy it was recorded with, the replay re-decides every
// decision as recorded: the same figures, nothing estimated, nothing
// changed; a field no decision reads changes nothing either.
func TestLivePolicyReproducesTheHistory(t *testing.T) {
	evs := recorded()
	for _, pol := range []string{`{"defaults": {"rung_floor": 0}}`, `{"defaults": {"rung_floor": 0, "previous_attempts": 2, "prompt_budget": 100}}`} {
		r := Replay(evs, Options{Policy: parse(t, pol)})
		if r.Tasks != 12 || r.Actual != r.WhatIf.Figures || r.WhatIf.Estimated != (Estimated{}) || len(r.Changed) != 0 {
			t.Fatalf("%s: actual %+v\nwhatif %+v\nchanged %+v", pol, r.Actual, r.WhatIf, r.Changed)
		}
		if r.Actual.Resolved != 8 || r.Actual.ToHuman != 4 || r.Actual.Attempts != 4+14+28 {
			t.Fatalf("actual %+v", r.Actual)
		}
	}
}

// A shorter ladder stops each task that needed more attempts at the new
// limit — its later attempts' tokens saved, sent to a human — and leaves
// the others alone; a longer one runs attempts the history never ran:
// estimated, apart.
func TestLadderLengthChangesTaskByTask(t *testing.T) {
	evs := recorded()
	r := Replay(evs, Options{Policy: parse(t, `{"defaults": {"rung_floor": 0, "max_retries": 3}}`)})
	want := map[string]int{"hard-2": 3, "hard-3": 3, "never-0": 3, "never-1": 3, "never-2": 3, "never-3": 3}
	if len(r.Changed) != len(want) {
		t.Fatalf("changed %+v", r.Changed)
	}
	var saved int64
	for _, c := range r.Changed {
		if want[c.ID] != c.WhatIf.Attempts || c.WhatIf.Fate != FateToHuman || c.WhatIf.Cause != CauseLadder {
			t.Errorf("%s: %+v", c.ID, c.WhatIf)
		}
		saved += c.Actual.Tokens - c.WhatIf.Tokens
	}
	// hard-2 resolved on attempt 4, hard-3 on 5: now to a human.
	if r.WhatIf.Resolved != 6 || r.WhatIf.ToHuman != 6 || r.Actual.Tokens-r.WhatIf.Tokens != saved || saved == 0 {
		t.Fatalf("whatif %+v, saved %d", r.WhatIf, saved)
	}
	long := Replay(evs, Options{Policy: parse(t, `{"defaults": {"rung_floor": 0, "max_retries": 9}}`)})
	for _, c := range long.Changed {
		if c.Type != "hopeless" || c.WhatIf.Fate != FateEstimated || c.WhatIf.Attempts != 7 {
			t.Errorf("%s: %+v", c.ID, c.WhatIf)
		}
	}
	if e := long.WhatIf.Estimated; len(long.Changed) != 4 || e.Tasks != 4 || e.Attempts < 4 || e.Attempts > 8 || e.ToHuman <= 0 {
		t.Fatalf("estimated %+v, changed %+v", e, long.Changed)
	}
}

// A threshold above the hopeless type's score holds its tasks once it is
// scored on its own evidence (min_outcomes 2: after never-0 and never-1),
// and a held task goes to a human at the hold time (no probe within the
// hour); the types that succeed score above it and change nothing.
func TestThresholdHoldsTheTypeBelowIt(t *testing.T) {
	evs := recorded()
	r := Replay(evs, Options{Policy: parse(t, `{"defaults": {"rung_floor": 0, "threshold": 0.5, "min_outcomes": 2, "hold_time": "1s", "probe_interval": "1h"}}`)})
	var ids []string
	for _, c := range r.Changed {
		ids = append(ids, c.ID)
		if c.Type != "hopeless" || c.WhatIf.Fate != FateToHuman || c.WhatIf.Decision != "block" || c.WhatIf.Cause != string(events.CauseTrust) || c.WhatIf.Attempts != 0 {
			t.Errorf("%s (%s): %+v (cause %s)", c.ID, c.Type, c.WhatIf, c.Cause)
		}
	}
	if fmt.Sprint(ids) != "[never-2 never-3]" {
		t.Fatalf("changed %v", ids)
	}
	if r.WhatIf.ToHuman != r.Actual.ToHuman || r.Actual.Tokens-r.WhatIf.Tokens != 2*2870 || r.WhatIf.Estimated != (Estimated{}) {
		t.Fatalf("actual %+v whatif %+v", r.Actual, r.WhatIf)
	}
}
