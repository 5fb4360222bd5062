package ladder_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
)

const (
	refine   = events.RungRefine
	pivot    = events.RungPivot
	research = events.RungResearch
	handoff  = events.RungHandoff
)

func fail(n int, approach string) ladder.Outcome {
	return ladder.Outcome{Attempt: n, Approach: approach, Reason: "broken", ErrorClass: events.ErrorClassTask}
}

// climb fails attempts one after another from a fresh state and returns the
// rung each attempt ran on, then the final decision.
func climb(c ladder.Config, start events.Rung, n int) (rungs []events.Rung, last ladder.Decision) {
	s := ladder.State{Rung: start}
	for i := 1; i <= n; i++ {
		rungs = append(rungs, s.Rung)
		last = c.Next(s, fail(i, "approach"))
		if last.Handoff() {
			return rungs, last
		}
		s = last.State
	}
	return rungs, last
}

func TestLadderSequence(t *testing.T) {
	rungs, last := climb(ladder.Config{}, refine, 20)
	want := []events.Rung{refine, refine, pivot, pivot, research, pivot, pivot}
	if !slices.Equal(rungs, want) || !last.Handoff() {
		t.Fatalf("rungs = %v handoff=%v, want %v then HANDOFF", rungs, last.Handoff(), want)
	}
	if len(last.State.DeadEnds) != 7 || last.State.PivotCount != 4 {
		t.Fatalf("dead ends %d, pivot_count %d", len(last.State.DeadEnds), last.State.PivotCount)
	}
}

func TestLadderTransitions(t *testing.T) {
	research1 := []events.DeadEnd{{Approach: "look it up", Attempt: 5, Rung: research}}
	// the first round's RESEARCH (attempt 5), then a requeue after attempt 7
	round2 := ladder.State{Rung: pivot, Failed: 3, PivotCount: 1, RoundStart: 7, DeadEnds: research1}
	// an earlier task's RESEARCH failure, shown to a task starting on PIVOT
	earlier := ladder.State{Rung: pivot, Failed: 1, PivotCount: 1, DeadEnds: []events.DeadEnd{{Approach: "look it up", Rung: research}}}
	cases := []struct {
		name string
		cfg  ladder.Config
		in   ladder.State
		out  ladder.Outcome
		next events.Rung
		pc   int
	}{
		{"first failure stays on REFINE", ladder.Config{}, ladder.State{Rung: refine}, fail(1, "a"), refine, 0},
		{"empty rung is REFINE", ladder.Config{}, ladder.State{}, fail(1, "a"), refine, 0},
		{"second REFINE failure pivots", ladder.Config{}, ladder.State{Rung: refine, Failed: 1}, fail(2, "a"), pivot, 0},
		{"pivot_count counts attempts on PIVOT", ladder.Config{}, ladder.State{Rung: pivot, Failed: 2}, fail(3, "b"), pivot, 1},
		{"two PIVOT attempts lead to RESEARCH", ladder.Config{}, ladder.State{Rung: pivot, Failed: 3, PivotCount: 1}, fail(4, "c"), research, 2},
		{"RESEARCH is one pass", ladder.Config{}, ladder.State{Rung: research, Failed: 4, PivotCount: 2}, fail(5, "d"), pivot, 2},
		{"used flag comes from the dead-ends log", ladder.Config{}, ladder.State{Rung: pivot, Failed: 5, PivotCount: 2, DeadEnds: research1}, fail(6, "e"), pivot, 3},
		{"a new round has a RESEARCH pass of its own", ladder.Config{}, round2, fail(11, "e"), research, 2},
		{"an earlier task's RESEARCH is not this task's", ladder.Config{}, earlier, fail(2, "e"), research, 2},
		{"HANDOFF guard first", ladder.Config{MaxRetries: 3}, ladder.State{Rung: refine, Failed: 2}, fail(3, "a"), handoff, 0},
		{"HANDOFF guard beats everything", ladder.Config{MaxRetries: 1}, ladder.State{Rung: refine}, fail(1, "a"), handoff, 0},
		{"auth short-circuits", ladder.Config{}, ladder.State{Rung: refine}, ladder.Outcome{Attempt: 1, ErrorClass: events.ErrorClassAuth}, handoff, 0},
		{"quota short-circuits", ladder.Config{}, ladder.State{Rung: pivot, Failed: 2}, ladder.Outcome{Attempt: 3, ErrorClass: events.ErrorClassQuota}, handoff, 1},
		{"command timeout short-circuits", ladder.Config{}, ladder.State{Rung: refine}, ladder.Outcome{Attempt: 1, ErrorClass: events.ErrorClassTimeout}, handoff, 0},
		{"deterministic error climbs normally", ladder.Config{}, ladder.State{Rung: refine}, ladder.Outcome{Attempt: 1, ErrorClass: events.ErrorClassDeterministic}, refine, 0},
		{"success resets to REFINE", ladder.Config{}, ladder.State{Rung: research, Failed: 4, PivotCount: 2}, ladder.Outcome{Attempt: 5, Success: true}, refine, 2},
		{"recurring start on PIVOT counts", ladder.Config{}, ladder.State{Rung: pivot}, fail(1, "a"), pivot, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := c.cfg.Next(c.in, c.out)
			if d.Next != c.next || d.State.PivotCount != c.pc {
				t.Fatalf("next %s pivot_count %d, want %s %d", d.Next, d.State.PivotCount, c.next, c.pc)
			}
			if !c.out.Success {
				de := d.State.DeadEnds[len(d.State.DeadEnds)-1]
				if de.Rung != orRefine(c.in.Rung) || de.Attempt != c.out.Attempt {
					t.Fatalf("dead end %+v not recorded with the attempt's rung", de)
				}
			}
			if len(c.in.DeadEnds) > 0 && &c.in.DeadEnds[0] == &d.State.DeadEnds[0] {
				t.Fatal("Next changed its input's dead ends")
			}
		})
	}
}

func orRefine(r events.Rung) events.Rung {
	if r == "" {
		return refine
	}
	return r
}

func TestStartRung(t *testing.T) {
	c := ladder.Config{}
	for failures, want := range map[int]events.Rung{0: refine, 2: refine, 3: pivot, 9: pivot} {
		if got := c.StartRung(failures); got != want {
			t.Errorf("StartRung(%d) = %s, want %s", failures, got, want)
		}
	}
	if _, last := climb(c, pivot, 20); len(last.State.DeadEnds) != 7 {
		t.Fatalf("a recurring task gets %d attempts, want 7", len(last.State.DeadEnds))
	}
}

func TestRepeatsDeadEnd(t *testing.T) {
	ends := []events.DeadEnd{{Approach: "Add a null check in handleResponse()"}}
	for approach, want := range map[string]bool{
		"add a null check in handleResponse":       true,
		"  ADD A NULL-CHECK IN handleResponse()!!": true,
		"guard parsePayload()":                     false,
		"":                                         false,
	} {
		if _, got := ladder.RepeatsDeadEnd(approach, ends); got != want {
			t.Errorf("RepeatsDeadEnd(%q) = %v", approach, got)
		}
	}
}

// Property: whatever the outcomes and max_retries, HANDOFF comes within
// max_retries failed attempts, and a success always resets to REFINE.
func TestLadderAlwaysEnds(t *testing.T) {
	classes := []events.ErrorClass{events.ErrorClassTask, events.ErrorClassDeterministic, events.ErrorClassRefused, events.ErrorClassAuth, events.ErrorClassInvalidOutput}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		c := ladder.Config{MaxRetries: 1 + r.IntN(12)}
		s := ladder.State{Rung: []events.Rung{refine, pivot}[r.IntN(2)]}
		failed := 0
		for step := 0; ; step++ {
			if step > 10*c.MaxRetries+10 {
				t.Fatalf("ladder did not end: max_retries %d state %+v", c.MaxRetries, s)
			}
			o := ladder.Outcome{Attempt: step + 1, Success: r.IntN(5) == 0, ErrorClass: classes[r.IntN(len(classes))]}
			d := c.Next(s, o)
			if o.Success {
				if d.Next != refine {
					t.Fatalf("success led to %s", d.Next)
				}
				s = d.State
				continue
			}
			failed++
			if failed > c.MaxRetries {
				t.Fatalf("%d failed attempts with max_retries %d", failed, c.MaxRetries)
			}
			if d.Handoff() {
				break
			}
			if n := countResearch(d.State.DeadEnds); n > 1 {
				t.Fatalf("RESEARCH ran %d times", n)
			}
			s = d.State
		}
	}
}

func countResearch(ends []events.DeadEnd) int {
	n := 0
	for _, d := range ends {
		if d.Rung == research {
			n++
		}
	}
	return n
}

func TestSkip(t *testing.T) {
	belowOf := func(rungs ...events.Rung) func(events.Rung) bool {
		return func(r events.Rung) bool { return slices.Contains(rungs, r) }
	}
	R, P, S, H := events.RungRefine, events.RungPivot, events.RungResearch, events.RungHandoff
	tests := []struct {
		rung         events.Rung
		researchUsed bool
		below        []events.Rung
		want         events.Rung
	}{
		{R, false, nil, R},
		{R, false, []events.Rung{R}, P},
		{R, false, []events.Rung{R, P}, S},
		{R, true, []events.Rung{R, P}, H},
		{R, false, []events.Rung{R, P, S}, H},
		{P, false, []events.Rung{R}, P},
		{P, false, []events.Rung{P}, S},
		{P, true, []events.Rung{P}, H},
		{S, false, []events.Rung{S}, P},
		{S, false, []events.Rung{S, P}, H},
		{"", false, []events.Rung{R, P, S}, ""}, // a pipeline step has no rung
	}
	for _, tt := range tests {
		if got := ladder.Skip(tt.rung, tt.researchUsed, belowOf(tt.below...)); got != tt.want {
			t.Errorf("Skip(%q, used=%v, below=%v) = %q, want %q", tt.rung, tt.researchUsed, tt.below, got, tt.want)
		}
	}
}
