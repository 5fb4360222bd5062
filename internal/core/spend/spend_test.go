package spend_test

import (
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/spend"
)

const (
	refine   = events.RungRefine
	pivot    = events.RungPivot
	research = events.RungResearch
)

// ok and fail are attempt records: tokens in, tokens out, cost.
func ok(rung events.Rung, in, out int, cost float64) events.AttemptRecord {
	return events.AttemptRecord{Rung: rung, Outcome: events.OutcomeSuccess, TokensIn: in, TokensOut: out, Cost: cost}
}

func fail(rung events.Rung, class events.ErrorClass, reason string, in, out int, cost float64) events.AttemptRecord {
	return events.AttemptRecord{Rung: rung, Outcome: events.OutcomeFailure, ErrorClass: class, Reason: reason,
		TokensIn: in, TokensOut: out, Cost: cost}
}

func refused(rung events.Rung) events.AttemptRecord {
	return fail(rung, events.ErrorClassRefused, "refused: identical to a request that already failed deterministically (ab12)", 0, 0, 0)
}

// task builds a state whose totals are the sums of its attempts, numbered
// 1, 2, … in order.
func task(typ string, status events.Status, h ...events.AttemptRecord) events.TaskState {
	st := events.TaskState{ID: typ + "-" + string(status), Type: typ, Status: status}
	for i := range h {
		h[i].Attempt, h[i].Pass = i+1, i+1
		st.TokensIn += h[i].TokensIn
		st.TokensOut += h[i].TokensOut
		st.Cost += h[i].Cost
	}
	st.History, st.Attempts = h, len(h)
	return st
}

func TestRetry(t *testing.T) {
	h := []events.AttemptRecord{
		ok("", 1, 1, 0), // 0 a pipeline step passes: the first attempt
		ok("", 1, 1, 0), // 1 the next step: progress, not a retry
		fail("", events.ErrorClassStep, "x", 1, 1, 0), // 2 after a pass: not a retry
		fail("", events.ErrorClassStep, "x", 1, 1, 0), // 3 after a failure: a retry
		ok("", 1, 1, 0), // 4 a retry that succeeded
	}
	want := []bool{false, false, false, true, true}
	for i, w := range want {
		if got := spend.Retry(h, i); got != w {
			t.Errorf("Retry(h, %d) = %v, want %v", i, got, w)
		}
	}
	if spend.Retry(h, 5) || spend.Retry(h, -1) {
		t.Error("Retry out of range is true")
	}
}

func TestSameError(t *testing.T) {
	cases := []struct {
		name string
		h    []events.AttemptRecord
		want bool // for the last attempt
	}{
		{"first failure", []events.AttemptRecord{fail(refine, events.ErrorClassTask, "x", 1, 1, 0)}, false},
		{"same reason again", []events.AttemptRecord{
			fail(refine, events.ErrorClassTask, "x", 1, 1, 0), fail(refine, events.ErrorClassTask, "x", 1, 1, 0)}, true},
		{"another reason", []events.AttemptRecord{
			fail(refine, events.ErrorClassTask, "x", 1, 1, 0), fail(pivot, events.ErrorClassTask, "y", 1, 1, 0)}, false},
		{"a passed step in between", []events.AttemptRecord{
			fail("", events.ErrorClassStep, "x", 1, 1, 0), ok("", 1, 1, 0), fail("", events.ErrorClassStep, "x", 1, 1, 0)}, true},
		{"only the nearest failure counts", []events.AttemptRecord{
			fail(refine, events.ErrorClassTask, "x", 1, 1, 0), fail(refine, events.ErrorClassTask, "y", 1, 1, 0),
			fail(pivot, events.ErrorClassTask, "x", 1, 1, 0)}, false},
		{"a success is no error", []events.AttemptRecord{fail(refine, events.ErrorClassTask, "x", 1, 1, 0), ok(refine, 1, 1, 0)}, false},
		{"two empty reasons are no evidence", []events.AttemptRecord{
			fail(refine, "", "", 1, 1, 0), fail(refine, "", "", 1, 1, 0)}, false},
		{"a refusal repeated", []events.AttemptRecord{refused(pivot), refused(pivot)}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := spend.SameError(c.h, len(c.h)-1); got != c.want {
				t.Errorf("SameError = %v, want %v", got, c.want)
			}
		})
	}
}

func TestStatuses(t *testing.T) {
	for status, want := range map[events.Status][2]bool{ // resolved, unresolved
		events.StatusSucceeded:        {true, false},
		events.StatusBlocked:          {false, true},
		events.StatusFailed:           {false, true},
		events.StatusNeedsHumanReview: {false, true},
		events.StatusCancelled:        {false, true},
		events.StatusPending:          {false, false},
		events.StatusVerifying:        {false, false},
		events.StatusRunning:          {false, false},
		events.StatusParked:           {false, false},
	} {
		if got := [2]bool{spend.Resolved(status), spend.Unresolved(status)}; got != want {
			t.Errorf("%s: resolved, unresolved = %v, want %v", status, got, want)
		}
	}
}

func TestRound(t *testing.T) {
	st := task("bug_fix", events.StatusSucceeded,
		fail(refine, events.ErrorClassTask, "x", 100, 10, 0.1), fail(refine, events.ErrorClassTask, "x", 100, 10, 0.1),
		ok(refine, 300, 30, 0.3))
	st.RoundStart = 2 // a human requeued after two attempts
	n, u := spend.Round(&st)
	if n != 1 || u != (events.Usage{TokensIn: 300, TokensOut: 30, Cost: 0.3}) {
		t.Errorf("Round = %d, %+v; want the third attempt only", n, u)
	}
	st.RoundStart = 0
	if n, u := spend.Round(&st); n != 3 || u.TokensIn != 500 {
		t.Errorf("Round without a requeue = %d, %+v; want every attempt", n, u)
	}
}

func ptr(v float64) *float64 { return &v }

func TestFold(t *testing.T) {
	cases := []struct {
		name   string
		states []events.TaskState
		want   spend.Figures // the total; Type ""
	}{
		{
			name: "nothing",
			want: spend.Figures{},
		},
		{
			name: "resolved on the first attempt",
			states: []events.TaskState{
				task("css_fix", events.StatusSucceeded, ok(refine, 1000, 200, 0.01)),
			},
			want: spend.Figures{
				Tasks: 1, Resolved: 1, Tokens: 1200, Cost: 0.01, ResolvedTokens: 1200, ResolvedCost: 0.01,
				Attempts: 1, ResolvedAttempts: 1,
				Rungs:    map[string]spend.Rung{string(refine): {Attempts: 1, Prompted: 1, PromptTokens: 1000, PromptTokensPerAttempt: ptr(1000)}},
				LoopRate: ptr(1), CostPerResolved: ptr(0.01), TokensPerResolved: ptr(1200), RepeatCallRate: ptr(0),
			},
		},
		{
			name: "resolved after the same failure twice",
			states: []events.TaskState{
				task("css_fix", events.StatusSucceeded,
					fail(refine, events.ErrorClassTask, "still red", 1000, 100, 0.01),
					fail(refine, events.ErrorClassTask, "still red", 1400, 100, 0.02),
					ok(pivot, 2000, 300, 0.03)),
			},
			want: spend.Figures{
				Tasks: 1, Resolved: 1, Tokens: 4900, Cost: 0.06, ResolvedTokens: 4900, ResolvedCost: 0.06,
				Attempts: 3, ResolvedAttempts: 3, Retries: 2, RetrySuccesses: 1, SameErrorRetries: 1,
				Rungs: map[string]spend.Rung{
					string(refine): {Attempts: 2, Prompted: 2, PromptTokens: 2400, PromptTokensPerAttempt: ptr(1200)},
					string(pivot):  {Attempts: 1, Prompted: 1, PromptTokens: 2000, PromptTokensPerAttempt: ptr(2000)},
				},
				RetrySuccessRate: ptr(0.5), LoopRate: ptr(3), CostPerResolved: ptr(0.06), TokensPerResolved: ptr(4900),
				RepeatCallRate: ptr(0),
			},
		},
		{
			name: "blocked after a refusal: wasted, a repeat call",
			states: []events.TaskState{
				task("bug_fix", events.StatusBlocked,
					fail(refine, events.ErrorClassDeterministic, "400 bad tool schema", 500, 0, 0.005),
					refused(refine)),
			},
			want: spend.Figures{
				Tasks: 1, Unresolved: 1, Tokens: 500, Cost: 0.005, WastedTokens: 500, WastedCost: 0.005,
				Attempts: 2, Retries: 1, Refused: 1,
				Rungs:            map[string]spend.Rung{string(refine): {Attempts: 2, Prompted: 1, PromptTokens: 500, PromptTokensPerAttempt: ptr(500)}},
				RetrySuccessRate: ptr(0), RepeatCallRate: ptr(0.5),
			},
		},
		{
			name: "cancelled as stale: unresolved, nothing spent",
			states: []events.TaskState{
				task("css_fix", events.StatusCancelled),
			},
			want: spend.Figures{Tasks: 1, Unresolved: 1},
		},
		{
			name: "cancelled on a later pass: its spend is wasted",
			states: []events.TaskState{
				task("css_fix", events.StatusCancelled, fail(refine, events.ErrorClassTask, "x", 800, 100, 0.008)),
			},
			want: spend.Figures{
				Tasks: 1, Unresolved: 1, Tokens: 900, Cost: 0.008, WastedTokens: 900, WastedCost: 0.008, Attempts: 1,
				Rungs:          map[string]spend.Rung{string(refine): {Attempts: 1, Prompted: 1, PromptTokens: 800, PromptTokensPerAttempt: ptr(800)}},
				RepeatCallRate: ptr(0),
			},
		},
		{
			name: "open task: spent, neither resolved nor wasted, unbilled spend counted",
			states: []events.TaskState{func() events.TaskState {
				st := task("css_fix", events.StatusRunning, fail(refine, events.ErrorClassTask, "x", 100, 10, 0.001))
				st.Unbilled = events.Usage{TokensIn: 50, TokensOut: 5, Cost: 0.0005}
				return st
			}()},
			want: spend.Figures{
				Tasks: 1, Open: 1, Tokens: 165, Cost: 0.0015, Attempts: 1,
				Rungs:          map[string]spend.Rung{string(refine): {Attempts: 1, Prompted: 1, PromptTokens: 100, PromptTokensPerAttempt: ptr(100)}},
				RepeatCallRate: ptr(0),
			},
		},
		{
			name: "pipeline: only the attempt after a failed step is a retry",
			states: []events.TaskState{
				task("migrate", events.StatusSucceeded,
					ok("", 100, 10, 0.001), fail("", events.ErrorClassStep, "test failed", 0, 0, 0), ok("", 0, 0, 0)),
			},
			want: spend.Figures{
				Tasks: 1, Resolved: 1, Tokens: 110, Cost: 0.001, ResolvedTokens: 110, ResolvedCost: 0.001,
				Attempts: 3, ResolvedAttempts: 3, Retries: 1, RetrySuccesses: 1,
				Rungs:            map[string]spend.Rung{spend.NoRung: {Attempts: 3, Prompted: 1, PromptTokens: 100, PromptTokensPerAttempt: ptr(100)}},
				RetrySuccessRate: ptr(1), LoopRate: ptr(3), CostPerResolved: ptr(0.001), TokensPerResolved: ptr(110), RepeatCallRate: ptr(0),
			},
		},
		{
			name: "recorded before records kept a class: TaskState.Refused, capped at the failures",
			states: []events.TaskState{func() events.TaskState {
				st := task("bug_fix", events.StatusBlocked,
					fail(refine, "", "400", 10, 0, 0), fail(refine, "", "refused: …", 0, 0, 0))
				st.Refused = 3 // counted again on redeliveries
				return st
			}()},
			want: spend.Figures{
				Tasks: 1, Unresolved: 1, Tokens: 10, WastedTokens: 10, Attempts: 2, Retries: 1, Refused: 2,
				Rungs:            map[string]spend.Rung{string(refine): {Attempts: 2, Prompted: 1, PromptTokens: 10, PromptTokensPerAttempt: ptr(10)}},
				RetrySuccessRate: ptr(0), RepeatCallRate: ptr(1),
			},
		},
		{
			name: "gated before any attempt: no rates without a denominator",
			states: []events.TaskState{
				task("css_fix", events.StatusNeedsHumanReview),
			},
			want: spend.Figures{Tasks: 1, Unresolved: 1},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := spend.Fold(c.states...).Total
			equal(t, got, c.want)
		})
	}
}

func TestFoldPerType(t *testing.T) {
	r := spend.Fold(
		task("css_fix", events.StatusSucceeded, ok(refine, 1000, 200, 0.01)),
		task("bug_fix", events.StatusFailed, fail(refine, events.ErrorClassTask, "x", 300, 30, 0.003)),
		task("css_fix", events.StatusBlocked, fail(refine, events.ErrorClassTask, "y", 500, 50, 0.005),
			fail(pivot, events.ErrorClassTask, "y", 700, 70, 0.007), fail(research, events.ErrorClassTask, "z", 900, 90, 0.009)),
	)
	if len(r.Types) != 2 || r.Types[0].Type != "bug_fix" || r.Types[1].Type != "css_fix" {
		t.Fatalf("types = %+v, want bug_fix and css_fix in order", r.Types)
	}
	css := r.Types[1]
	if css.Tasks != 2 || css.Resolved != 1 || css.Unresolved != 1 || css.WastedTokens != 2310 || css.Retries != 2 ||
		css.SameErrorRetries != 1 || *css.LoopRate != 1 || css.Rungs[string(research)].PromptTokens != 900 {
		t.Errorf("css_fix = %+v", css)
	}
	if r.Total.Type != "" || r.Total.Tasks != 3 || r.Total.Unresolved != 2 || r.Total.WastedTokens != 2640 ||
		!near(r.Total.WastedCost, 0.024) || !near(r.Total.Cost, 0.034) || r.Total.Attempts != 5 {
		t.Errorf("total = %+v", r.Total)
	}
	if css.Rungs[string(refine)].Attempts+r.Types[0].Rungs[string(refine)].Attempts != r.Total.Rungs[string(refine)].Attempts {
		t.Errorf("rung attempts do not add up: %+v", r.Total.Rungs)
	}
}

func TestRungOrder(t *testing.T) {
	got := []string{spend.NoRung, "OTHER", string(research), string(events.RungHandoff), string(pivot), string(refine)}
	slices.SortFunc(got, spend.RungOrder)
	want := []string{string(refine), string(pivot), string(research), string(events.RungHandoff), "OTHER", spend.NoRung}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("order = %v, want %v", got, want)
	}
}

// equal compares figures, floats within a rounding error.
func equal(t *testing.T, got, want spend.Figures) {
	t.Helper()
	floats := func(f *spend.Figures) []*float64 {
		return []*float64{&f.Cost, &f.ResolvedCost, &f.WastedCost}
	}
	rates := func(f *spend.Figures) []**float64 {
		return []**float64{&f.RetrySuccessRate, &f.LoopRate, &f.CostPerResolved, &f.TokensPerResolved, &f.RepeatCallRate}
	}
	names := []string{"cost", "resolved cost", "wasted cost"}
	for i, g := range floats(&got) {
		if w := *floats(&want)[i]; !near(*g, w) {
			t.Errorf("%s = %v, want %v", names[i], *g, w)
		}
		*g = *floats(&want)[i]
	}
	rateNames := []string{"retry success rate", "loop rate", "cost per resolved", "tokens per resolved", "repeat-call rate"}
	for i, g := range rates(&got) {
		w := *rates(&want)[i]
		switch {
		case (*g == nil) != (w == nil):
			t.Errorf("%s = %v, want %v", rateNames[i], show(*g), show(w))
		case *g != nil && !near(**g, *w):
			t.Errorf("%s = %v, want %v", rateNames[i], **g, *w)
		}
		*g = w
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("figures\n got %+v\nwant %+v", got, want)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func show(p *float64) any {
	if p == nil {
		return "nil"
	}
	return *p
}
