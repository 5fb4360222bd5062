package whatif

import (
	"testing"
	"time"
)

// The what-if looks at a held backlog that failed when re-admitted as the
// gate's sweeper wakes it: those past their hold time first, oldest first,
// then the rest newest first.
func TestNewestFirst(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	hold := 24 * time.Hour
	var held []*taskRun
	for _, age := range []time.Duration{2 * hold, hold, time.Hour, time.Minute, time.Second} {
		held = append(held, &taskRun{heldSince: now.Add(-age)})
	}
	got := newestFirst(held, hold, now)
	want := []*taskRun{held[0], held[1], held[4], held[3], held[2]}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("position %d: held since %s, want %s", i, got[i].heldSince, want[i].heldSince)
		}
	}
	if held[4].heldSince != now.Add(-time.Second) {
		t.Fatal("the held passes were reordered in place")
	}
}
