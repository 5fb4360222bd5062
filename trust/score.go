package trust

import (
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Outcome is the result of one attempt of a task of some type.
type Outcome struct {
	// Key identifies the attempt (e.g. "taskid:pass"); recording the same key
	// twice counts it once.
	Key     string    `json:"key"`
	Success bool      `json:"success"`
	At      time.Time `json:"at"`
	// Tokens and Cost the attempt spent, for the record (the daily budget
	// reads the spend counters, Spending).
	Tokens int     `json:"tokens,omitempty"`
	Cost   float64 `json:"cost,omitempty"`
	// Rung is the escalation rung the attempt ran on ("" for pipeline steps)
	// and Retry is set when it was not the task's first attempt: together
	// they measure how often a retry on each rung succeeds (RungRate).
	Rung  events.Rung `json:"rung,omitempty"`
	Retry bool        `json:"retry,omitempty"`
}

// Score scores the last p.Window outcomes (oldest first):
//
//	score = OverallWeight × overall + RecencyWeight × recency
//
// where overall is the success rate and recency the success rate with the
// i-th newest outcome weighted Decay^i. All three are 0 without outcomes.
func Score(outcomes []Outcome, p Policy) (score, overall, recency float64) {
	p = p.WithDefaults()
	outcomes = lastN(outcomes, p.Window)
	if len(outcomes) == 0 {
		return 0, 0, 0
	}
	var successes, weighted, total float64
	w := 1.0
	for i := len(outcomes) - 1; i >= 0; i-- {
		if outcomes[i].Success {
			successes++
			weighted += w
		}
		total += w
		w *= p.Decay
	}
	overall = successes / float64(len(outcomes))
	recency = weighted / total
	return p.OverallWeight*overall + p.RecencyWeight*recency, overall, recency
}

// Verdict is the gate's finding for one task type.
type Verdict struct {
	Score float64
	// Outcomes is the number of outcomes scored (at most the window), of
	// which Successes succeeded and Failures failed.
	Outcomes            int
	Successes, Failures int
	Threshold           float64
	Exempt              bool
	// Below is true when gating applies and the score is below the threshold:
	// the task must not be dispatched (unless Store.Gate makes it a probe).
	Below bool
	// Reason is set only when Below, e.g.
	// "Blocked: css_fix trust score 0.08 below 0.15".
	Reason string
}

// Evaluate decides whether taskType, with stats s, is below the threshold.
// Exempt types and types with fewer than MinOutcomes outcomes in the window
// are never Below.
func (p Policy) Evaluate(taskType string, s Stats) Verdict {
	p = p.WithDefaults()
	score, _, _ := Score(s.Outcomes, p)
	scored := Stats{Outcomes: lastN(s.Outcomes, p.Window)}
	v := Verdict{
		Score:     score,
		Outcomes:  len(scored.Outcomes),
		Threshold: p.Threshold,
		Exempt:    p.Exempted(taskType),
	}
	v.Successes, v.Failures = scored.Counts()
	v.Below = !v.Exempt && v.Outcomes >= p.MinOutcomes && score < p.Threshold
	if v.Below {
		v.Reason = fmt.Sprintf("Blocked: %s trust score %.2f below %.2f", taskType, score, p.Threshold)
	}
	return v
}

func lastN[T any](s []T, n int) []T {
	if n >= 0 && len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
