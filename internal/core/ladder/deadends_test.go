package ladder_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

// ends are dead ends of attempts from..to on rung, with one-word texts.
func ends(from, to int, rung events.Rung) []events.DeadEnd {
	var out []events.DeadEnd
	for n := from; n <= to; n++ {
		out = append(out, events.DeadEnd{Approach: fmt.Sprint("try ", n), Reason: "broken", Attempt: n, Rung: rung})
	}
	return out
}

func cat(parts ...[]events.DeadEnd) []events.DeadEnd {
	var out []events.DeadEnd
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestCapDeadEnds(t *testing.T) {
	max := ladder.MaxDeadEnds
	long := events.DeadEnd{Approach: strings.Repeat("a", 3000), Reason: strings.Repeat("r", 5000), Attempt: 1, Rung: pivot}
	earlier := []events.DeadEnd{{Approach: "an earlier task's", Reason: "x", Rung: research}}
	tests := []struct {
		name string
		in   []events.DeadEnd
		want []events.DeadEnd
	}{
		{"nil", nil, nil},
		{"within the caps", ends(1, max, pivot), ends(1, max, pivot)},
		{"oldest dropped first", ends(1, max+3, pivot), ends(4, max+3, pivot)},
		{"the round's RESEARCH is kept", cat(ends(1, 3, pivot), ends(4, 4, research), ends(5, max+6, pivot)),
			cat(ends(4, 4, research), ends(8, max+6, pivot))},
		{"only the newest RESEARCH is kept", cat(ends(1, 1, research), ends(2, 2, research), ends(3, max+2, pivot)),
			cat(ends(2, 2, research), ends(4, max+2, pivot))},
		{"an earlier task's RESEARCH is not kept", cat(earlier, ends(1, max, pivot)), ends(1, max, pivot)},
		{"texts cut", []events.DeadEnd{long}, []events.DeadEnd{{
			Approach: textcut.Cut(long.Approach, events.MaxApproach), Reason: textcut.Cut(long.Reason, ladder.MaxDeadEndReason),
			Attempt: 1, Rung: pivot}}},
		{"an approach up to the answer's cap stays whole", []events.DeadEnd{{Approach: strings.Repeat("a", events.MaxApproach)}},
			[]events.DeadEnd{{Approach: strings.Repeat("a", events.MaxApproach)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]events.DeadEnd(nil), tt.in...)
			got := ladder.CapDeadEnds(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("CapDeadEnds = %v\nwant %v", got, tt.want)
			}
			if !reflect.DeepEqual(tt.in, in) {
				t.Fatal("CapDeadEnds changed its input")
			}
			if !reflect.DeepEqual(ladder.CapDeadEnds(got), got) {
				t.Fatal("CapDeadEnds is not idempotent")
			}
			if strings.Contains(tt.name, "cut") && (!strings.HasSuffix(got[0].Approach, " bytes more]") || !strings.HasSuffix(got[0].Reason, " bytes more]")) {
				t.Fatalf("cut not marked: %+v", got[0])
			}
		})
	}
}

// A task failing round after round (a human requeues it each time it is
// handed off) carries at most MaxDeadEnds, the newest, and each round
// still gets exactly one RESEARCH pass.
func TestLadderKeepsTheNewestDeadEnds(t *testing.T) {
	c := ladder.Config{}
	s := ladder.State{Rung: refine}
	attempt := 0
	for round := range 8 {
		s.Rung, s.Failed, s.PivotCount, s.RoundStart = refine, 0, 0, attempt
		researched := 0
		for {
			attempt++
			if s.Rung == research {
				researched++
			}
			d := c.Next(s, fail(attempt, fmt.Sprint("approach ", attempt)))
			s = d.State
			if n := len(s.DeadEnds); n > ladder.MaxDeadEnds {
				t.Fatalf("attempt %d: %d dead ends carried", attempt, n)
			}
			if last := s.DeadEnds[len(s.DeadEnds)-1]; last.Attempt != attempt {
				t.Fatalf("attempt %d: the newest dead end is of attempt %d", attempt, last.Attempt)
			}
			if d.Handoff() {
				break
			}
		}
		if researched != 1 {
			t.Fatalf("round %d made %d RESEARCH passes, want 1", round+1, researched)
		}
	}
	if first := s.DeadEnds[0].Attempt; len(s.DeadEnds) != ladder.MaxDeadEnds || first <= attempt-ladder.MaxDeadEnds-1 {
		t.Fatalf("after %d attempts: %d dead ends from attempt %d", attempt, len(s.DeadEnds), first)
	}
}
