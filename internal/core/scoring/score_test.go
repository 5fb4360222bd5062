package scoring_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

// seq builds outcomes from a pattern of S (success) and F (failure), oldest
// first: each one a task of one attempt, which ended.
func seq(pattern string) []scoring.Outcome {
	base := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	out := make([]scoring.Outcome, len(pattern))
	for i, c := range pattern {
		out[i] = scoring.Outcome{Key: "t" + strconv.Itoa(i) + ":1", Success: c == 'S', End: true, At: base.Add(time.Duration(i) * time.Minute)}
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestScore(t *testing.T) {
	tests := []struct {
		name                    string
		outcomes                []scoring.Outcome
		score, overall, recency float64
	}{
		{"empty", nil, 0, 0, 0},
		{"all success", seq(strings.Repeat("S", 20)), 1, 1, 1},
		{"all failure", seq(strings.Repeat("F", 20)), 0, 0, 0},
		// newest success weighs 1, older failure 0.9: recency = 1/1.9.
		{"mixed", seq("FS"), 0.6*0.5 + 0.4/1.9, 0.5, 1 / 1.9},
		{"mixed reversed", seq("SF"), 0.6*0.5 + 0.4*0.9/1.9, 0.5, 0.9 / 1.9},
		// 10 failures fall out of the 50-outcome window.
		{"window trims oldest", seq(strings.Repeat("F", 10) + strings.Repeat("S", 50)), 1, 1, 1},
		// the documented claim: with Decay 0.9 the newest 10 of 50 carry ~65% of the weight.
		{"newest ten carry 65%", seq(strings.Repeat("F", 40) + strings.Repeat("S", 10)),
			0.6*0.2 + 0.4*(1-math.Pow(0.9, 10))/(1-math.Pow(0.9, 50)), 0.2, (1 - math.Pow(0.9, 10)) / (1 - math.Pow(0.9, 50))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			score, overall, recency := scoring.Score(tt.outcomes, scoring.Policy{})
			if !near(score, tt.score) || !near(overall, tt.overall) || !near(recency, tt.recency) {
				t.Errorf("Score = %v, %v, %v; want %v, %v, %v", score, overall, recency, tt.score, tt.overall, tt.recency)
			}
		})
	}
}

func TestScoreRecentFailuresWeighMore(t *testing.T) {
	oldFailure, _, _ := scoring.Score(seq("FSSSSSSSSS"), scoring.Policy{})
	newFailure, _, _ := scoring.Score(seq("SSSSSSSSSF"), scoring.Policy{})
	if newFailure >= oldFailure {
		t.Errorf("recent failure scores %v, old failure %v: want the recent one lower", newFailure, oldFailure)
	}
	if near(newFailure, 0.9) || near(oldFailure, 0.9) {
		t.Errorf("recency had no effect: %v, %v", newFailure, oldFailure)
	}
}

func TestScoreCustomWindow(t *testing.T) {
	score, _, _ := scoring.Score(seq("FFFSS"), scoring.Policy{Window: 2})
	if score != 1 {
		t.Errorf("score over a 2-outcome window = %v, want 1", score)
	}
}

func TestEvaluate(t *testing.T) {
	// One success among 12 outcomes, at age 6: score 0.0796.
	lowTrust := seq("FFFFFSFFFFFF")
	tests := []struct {
		name     string
		policy   scoring.Policy
		taskType string
		outcomes []scoring.Outcome
		want     scoring.Verdict
	}{
		{
			name: "below threshold", taskType: "css_fix", outcomes: lowTrust,
			want: scoring.Verdict{Outcomes: 12, Successes: 1, Failures: 11, Settled: 12, Threshold: 0.15, Below: true, Reason: "Blocked: css_fix trust score 0.08 below 0.15"},
		},
		{
			name: "below min outcomes never gated", taskType: "css_fix", outcomes: seq(strings.Repeat("F", 9)),
			want: scoring.Verdict{Outcomes: 9, Failures: 9, Settled: 9, Unproven: true, Threshold: 0.15},
		},
		{
			name: "exactly min outcomes gated", taskType: "css_fix", outcomes: seq(strings.Repeat("F", 10)),
			want: scoring.Verdict{Outcomes: 10, Failures: 10, Settled: 10, Threshold: 0.15, Below: true, Reason: "Blocked: css_fix trust score 0.00 below 0.15"},
		},
		{
			name: "default exempt never gated", taskType: "security_fix", outcomes: seq(strings.Repeat("F", 30)),
			want: scoring.Verdict{Outcomes: 30, Failures: 30, Settled: 30, Threshold: 0.15, Exempt: true},
		},
		{
			name: "custom exempt", policy: scoring.Policy{Exempt: []string{"css_fix"}}, taskType: "css_fix", outcomes: lowTrust,
			want: scoring.Verdict{Outcomes: 12, Successes: 1, Failures: 11, Settled: 12, Threshold: 0.15, Exempt: true},
		},
		{
			name: "empty exempt list gates defaults", policy: scoring.Policy{Exempt: []string{}}, taskType: "triage_fix", outcomes: seq(strings.Repeat("F", 10)),
			want: scoring.Verdict{Outcomes: 10, Failures: 10, Settled: 10, Threshold: 0.15, Below: true, Reason: "Blocked: triage_fix trust score 0.00 below 0.15"},
		},
		{
			name: "negative threshold never gates", policy: scoring.Policy{Threshold: -1}, taskType: "css_fix", outcomes: seq(strings.Repeat("F", 10)),
			want: scoring.Verdict{Outcomes: 10, Failures: 10, Settled: 10, Threshold: -1},
		},
		{
			name: "healthy", taskType: "css_fix", outcomes: seq(strings.Repeat("S", 60)),
			want: scoring.Verdict{Score: 1, Outcomes: 50, Successes: 50, Settled: 50, Threshold: 0.15},
		},
		{
			name: "counts the window only", taskType: "css_fix", outcomes: seq(strings.Repeat("S", 100) + strings.Repeat("F", 20)),
			// 20 failures in a row after 30 successes: a regression.
			want: scoring.Verdict{Outcomes: 50, Successes: 30, Failures: 20, Settled: 50, Threshold: 0.15, Run: 20, Below: true,
				Reason: "Blocked: css_fix trust score 0.41: its last 20 tasks failed, unlikely at its rate before (a regression?)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.policy.Evaluate(tt.taskType, scoring.Stats{Type: tt.taskType, Outcomes: tt.outcomes})
			wantScore, _, _ := scoring.Score(tt.outcomes, tt.policy)
			tt.want.Score = wantScore
			if got != tt.want {
				t.Errorf("Evaluate =\n %+v\nwant\n %+v", got, tt.want)
			}
		})
	}
}

func TestEvaluateThresholdBoundary(t *testing.T) {
	outcomes := seq("FFFFFFFFSF")
	score, _, _ := scoring.Score(outcomes, scoring.Policy{})
	st := scoring.Stats{Type: "css_fix", Outcomes: outcomes}

	at := scoring.Policy{Threshold: score}
	if v := at.Evaluate("css_fix", st); v.Below {
		t.Errorf("score equal to the threshold is gated: %+v", v)
	}
	above := scoring.Policy{Threshold: math.Nextafter(score, 1)}
	if v := above.Evaluate("css_fix", st); !v.Below {
		t.Errorf("score just below the threshold is not gated: %+v", v)
	}
}

func TestPolicyDefaults(t *testing.T) {
	p := scoring.Policy{}.WithDefaults()
	if p.Window != 50 || p.MinOutcomes != 10 || p.Threshold != 0.15 || p.OverallWeight != 0.6 ||
		p.RecencyWeight != 0.4 || p.Decay != 0.9 || p.ProbeAfter != 5 || len(p.Exempt) != 3 {
		t.Errorf("defaults = %+v", p)
	}
	if err := (scoring.Policy{}).Validate(); err != nil {
		t.Errorf("zero policy invalid: %v", err)
	}
	bad := scoring.Policy{Window: -1, Decay: 2, ProbeAfter: -3, Threshold: 1.5}
	err := bad.Validate()
	if err == nil {
		t.Fatal("invalid policy accepted")
	}
	for _, want := range []string{"window", "decay", "probe", "threshold"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error %q does not mention %s", err, want)
		}
	}
}
