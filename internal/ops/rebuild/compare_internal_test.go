package rebuild

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dispatchmesh/dispatchmesh/trust"
)

// A Difference shows a value's first 200 bytes, cut on a rune boundary.
func TestClip(t *testing.T) {
	tests := []struct {
		name string
		raw  json.RawMessage
		want string
	}{
		{"none", nil, "(none)"},
		{"short", json.RawMessage(`"ok"`), `"ok"`},
		{"cut", json.RawMessage(strings.Repeat("a", 201)), strings.Repeat("a", 200) + "…"},
		// `"` then 2-byte "é"s: byte 200 is inside the 100th, left out.
		{"rune boundary", json.RawMessage(`"` + strings.Repeat("é", 150) + `"`), `"` + strings.Repeat("é", 99) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := clip(tt.raw)
			if got != tt.want || !utf8.ValidString(got) {
				t.Fatalf("clip = %q, want %q", got, tt.want)
			}
		})
	}
}

// Two gate workers may commit steps of a type's block streak in one order
// and store their events in the other: the live facts of any commit order
// of the recorded steps are taken as they are, nothing else is.
func TestGateStepsAllowCommitOrder(t *testing.T) {
	// Recorded: a, b, c held, d the probe (ProbeAfter 3); e held after it.
	g := &gateSteps{marks: map[string]bool{"a": false, "b": false, "c": false, "d": true, "e": false}}
	mark := func(keys string) []trust.GateMark {
		var out []trust.GateMark
		for _, k := range strings.Split(keys, " ") {
			out = append(out, trust.GateMark{Key: k, Probe: k == "d"})
		}
		return out
	}
	tests := []struct {
		name   string
		live   trust.Stats
		resets int
		want   bool
	}{
		{"stream order", trust.Stats{BlockStreak: 1, Gates: mark("a b c d e")}, 0, true},
		// e committed before d, stored after it: no block after the probe.
		{"committed the other way", trust.Stats{BlockStreak: 0, Gates: mark("a b c e d")}, 0, true},
		{"streak not the blocks after the probe", trust.Stats{BlockStreak: 1, Gates: mark("a b c e d")}, 0, false},
		{"reset after the last block", trust.Stats{BlockStreak: 0, Gates: mark("a b c d e")}, 1, true},
		{"more than the blocks after the probe", trust.Stats{BlockStreak: 2, Gates: mark("a b c d e")}, 1, false},
		{"a mark lost", trust.Stats{BlockStreak: 1, Gates: mark("a b d e")}, 0, false},
		{"a mark no event records", trust.Stats{BlockStreak: 2, Gates: mark("a b c d e f")}, 0, false},
		{"a mark twice", trust.Stats{BlockStreak: 2, Gates: mark("a b c d e e")[1:]}, 0, false},
		{"another answer than the event's", trust.Stats{BlockStreak: 0, Gates: append(mark("a b c d"), trust.GateMark{Key: "e", Probe: true})}, 0, false},
		{"tampered streak", trust.Stats{BlockStreak: 4, Gates: mark("a b c d e")}, 0, false},
		{"a negative streak, a reset since", trust.Stats{BlockStreak: -1, Gates: mark("a b c d e")}, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g.resets = tt.resets
			if got := g.allows(tt.live); got != tt.want {
				t.Fatalf("allows(%+v) = %v, want %v", tt.live, got, tt.want)
			}
		})
	}
}
