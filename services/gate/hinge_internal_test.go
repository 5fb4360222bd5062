package gate

import (
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

func TestMayHinge(t *testing.T) {
	p := trust.Policy{}.WithDefaults()
	first, retry := events.Run{Pass: 1, Attempt: 1}, events.Run{Pass: 2, Attempt: 2}
	scored := func(score float64) trust.Verdict { return trust.Verdict{Score: score, Outcomes: 50, Settled: 50} }
	tests := []struct {
		name   string
		run    events.Run
		v      trust.Verdict
		p      trust.Policy
		exempt bool
		want   bool
	}{
		{"a retry", retry, scored(1), p, false, true},
		{"an unproven type", first, trust.Verdict{Score: 0, Outcomes: 9, Unproven: true}, p, false, true},
		{"an exempt unproven type (no canaries)", first, trust.Verdict{Outcomes: 3, Unproven: true}, p, true, false},
		{"an unproven type never gated (no canaries)", first, trust.Verdict{Outcomes: 3, Unproven: true}, trust.Policy{Threshold: -1}.WithDefaults(), false, false},
		{"a retry of an exempt type (its rung's rate)", retry, scored(1), p, true, true},
		{"a human's requeue", events.Run{Pass: 3, Attempt: 2, Reviewed: true}, scored(0.15), p, false, false},
		{"far above the threshold", first, scored(0.9), p, false, false},
		{"far below", first, scored(0.01), trust.Policy{Threshold: 0.5}.WithDefaults(), false, false},
		{"near the threshold", first, scored(0.2), p, false, true},
		{"just below it", first, scored(0.1), p, false, true},
		{"exempt, near the threshold", first, scored(0.2), p, true, false},
		{"never gated (negative threshold)", first, scored(0.05), trust.Policy{Threshold: -1}.WithDefaults(), false, false},
		// one outcome moves a 5-outcome window's score by ~0.22: 0.4 off its
		// threshold is near, where a 50-outcome window's is not
		{"a small window: near further off", first, trust.Verdict{Score: 0.55, Outcomes: 12}, trust.Policy{Window: 5}.WithDefaults(), false, true},
		{"a small window: far", first, trust.Verdict{Score: 0.9, Outcomes: 12}, trust.Policy{Window: 5}.WithDefaults(), false, false},
		{"the default window: not near", first, scored(0.55), p, false, false},
	}
	for _, tt := range tests {
		if got := mayHinge(tt.run, tt.v, tt.p, tt.exempt); got != tt.want {
			t.Errorf("%s: mayHinge = %v, want %v", tt.name, got, tt.want)
		}
	}
}
