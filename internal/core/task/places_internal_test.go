package task

import (
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

// A look at a pass waiting for canaries reads nothing from the server
// while the view shows every place taken by a task still in flight.
func TestPlacesTaken(t *testing.T) {
	now := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	p := scoring.Policy{Canary: 2}.WithDefaults()
	places := func(keys ...string) []scoring.Canary {
		var cs []scoring.Canary
		for _, k := range keys {
			cs = append(cs, scoring.Canary{Key: k, At: now.Add(-time.Minute)})
		}
		return cs
	}
	ended := []scoring.Outcome{{Key: "a:1:outcome", Task: "a", Success: true, End: true, At: now}}
	tests := []struct {
		name  string
		stats scoring.Stats
		self  string
		want  bool
	}{
		{"every place taken", scoring.Stats{Canaries: places("a", "b")}, "w", true},
		{"a free place", scoring.Stats{Canaries: places("a")}, "w", false},
		{"its own place is no obstacle", scoring.Stats{Canaries: places("a", "w")}, "w", false},
		{"a holder that ended frees its place", scoring.Stats{Canaries: places("a", "b"), Outcomes: ended}, "w", false},
		{"an expired place is free", scoring.Stats{Canaries: []scoring.Canary{{Key: "a", At: now.Add(-time.Hour)}, {Key: "b", At: now}}}, "w", false},
	}
	for _, tt := range tests {
		if got := PlacesTaken(tt.stats, p, now, tt.self); got != tt.want {
			t.Errorf("%s: PlacesTaken = %v, want %v", tt.name, got, tt.want)
		}
	}
}
