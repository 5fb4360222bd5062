package rebuild

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"dispatchmesh/trust"
)

// The gate's canary places are nothing events imply: a type whose only
// gate facts are canary places, or whose facts are all zero, needs no
// entry, and differs from none. Its block streak and decisions do.
func TestGateFactsLeaveCanariesOut(t *testing.T) {
	canary := []trust.Canary{{Key: "t-1", At: time.Unix(100, 0).UTC()}}
	live := map[string]*trust.Stats{
		"css_fix":  {Type: "css_fix", Canaries: canary},
		"docs_fix": {Type: "docs_fix", BlockStreak: 2, Gates: []trust.GateMark{{Key: "d:1:gate"}, {Key: "d2:1:gate"}}, Canaries: canary},
	}
	rebuilt := map[string]*trust.Stats{
		"css_fix":  {Type: "css_fix", Outcomes: []trust.Outcome{{Key: "t-1:1:outcome"}}},
		"docs_fix": {Type: "docs_fix", BlockStreak: 1, Gates: []trust.GateMark{{Key: "d:1:gate"}}},
		"lint_fix": {Type: "lint_fix"},
	}
	diffs := compareValues("trust", live, rebuilt, gateFacts, noGateFacts)
	want := []Difference{
		{"trust", "docs_fix", "block_streak", "2", "1"},
		{"trust", "docs_fix", "gates", "2 entries, only here: d2:1:gate", "1 entry"},
	}
	if !slices.Equal(diffs, want) {
		t.Fatalf("differences:\n%v\nwant\n%v", diffs, want)
	}
}

// Outcomes are compared as deep as a policy may score (OutcomeDepth);
// older ones depend on the order concurrent recorders published them in.
func TestOutcomesComparedToTheLargestWindow(t *testing.T) {
	at := time.Unix(1000, 0).UTC()
	var all []trust.Outcome
	for i := range trust.Keep {
		all = append(all, trust.Outcome{Key: fmt.Sprintf("t-%03d:1:outcome", i), Success: true, At: at.Add(time.Duration(i) * time.Second)})
	}
	older := slices.Clone(all)
	older[0].Key = "late:1:outcome" // beyond the newest OutcomeDepth
	live := map[string]*trust.Stats{"css_fix": {Type: "css_fix", Outcomes: older}}
	rebuilt := map[string]*trust.Stats{"css_fix": {Type: "css_fix", Outcomes: all}}
	if diffs := compareValues(StoreOutcomes, live, rebuilt, newestOutcomes, noOutcomes); len(diffs) != 0 {
		t.Fatalf("an outcome older than the newest %d differs: %v", OutcomeDepth, diffs)
	}
	newer := slices.Clone(all)
	newer[len(newer)-1].Success = false
	live["css_fix"].Outcomes = newer
	diffs := compareValues(StoreOutcomes, live, rebuilt, newestOutcomes, noOutcomes)
	last := all[len(all)-1].Key
	if len(diffs) != 1 || diffs[0].Field != "outcomes" || !strings.Contains(diffs[0].Live, last) ||
		!strings.Contains(diffs[0].Live, `"success":false`) || !strings.Contains(diffs[0].Built, `"success":true`) {
		t.Fatalf("a changed newest outcome: %v", diffs)
	}
	live["css_fix"].Outcomes = nil
	if diffs := compareValues(StoreOutcomes, live, rebuilt, newestOutcomes, noOutcomes); len(diffs) != 1 || diffs[0].Field != "(entry)" {
		t.Fatalf("a type without outcomes: %v", diffs)
	}
}
