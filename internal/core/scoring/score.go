package scoring

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
	// Task is the task's id: a type's score counts tasks, not attempts
	// (Tasks). Empty on outcomes recorded before it existed: the id in Key.
	Task string `json:"task,omitempty"`
	// End is set on the attempt that ended the task without success (its
	// ladder's handoff, a pipeline's failure); a success ends it anyway.
	End bool `json:"end,omitempty"`
	// Probe is set on the attempts of an exploration probe.
	Probe bool `json:"probe,omitempty"`
	// Held is set on the attempts of a task the gate held for its type's
	// trust and let through later (events.Run.Readmitted): they measure
	// the type's held backlog (BacklogOf).
	Held bool `json:"held,omitempty"`
	// Marker: no attempt, the mark that the gate ended the task before
	// its next attempt (EndMarker).
	Marker bool `json:"marker,omitempty"`
}

// EndMarker is the outcome the gate publishes when it ends a task before
// an attempt (a handoff for the rung rate): no attempt, but the task's
// result is final, so it counts as settled (Tasks).
func EndMarker(taskID string, pass int, at time.Time) Outcome {
	return Outcome{Key: events.MsgID(taskID, pass, "end"), Task: taskID, End: true, Marker: true, At: at}
}

// Score scores the newest p.Window tasks among outcomes (Tasks: a task's
// attempts fold into one result):
//
//	score = OverallWeight × overall + RecencyWeight × recency
//
// where overall is the share of those tasks that succeeded (on any rung; a
// task still climbing its ladder counts as failed until it succeeds) and
// recency the same share with the i-th newest task weighted Decay^i. All
// three are 0 without outcomes.
func Score(outcomes []Outcome, p Policy) (score, overall, recency float64) {
	p = p.WithDefaults()
	return scoreTasks(p.tasks(outcomes, false), p)
}

// Verdict is the gate's finding for one task type.
type Verdict struct {
	Score float64
	// Outcomes is the number of tasks scored (at most the window), of
	// which Successes succeeded and Failures did not (yet).
	Outcomes            int
	Successes, Failures int
	// Settled is how many tasks of the window have a final result.
	Settled int
	// Unproven: fewer than MinOutcomes tasks settled — the type's own
	// evidence does not suffice (canaries go first).
	Unproven bool
	// Prior is the pooled evidence the score was shrunk toward, when the
	// type's own did not suffice (Prior.Known).
	Prior     Prior
	Threshold float64
	Exempt    bool
	// Run is the failed tasks in a row that stopped the type, when a run
	// that unlikely did (Policy.RunAlpha).
	Run int
	// Opened: a probe of the type succeeded and no task failed since, so
	// the type is let through while its score climbs back.
	Opened bool
	// Probation: Opened alone keeps the type from Below — its held tasks
	// come back a few at a time (Policy.TrialPlaces).
	Probation bool
	// Below is true when gating applies and the score is below the threshold:
	// the task must not be dispatched (unless Store.Gate makes it a probe).
	Below bool
	// Reason is set only when Below, e.g.
	// "Blocked: css_fix trust score 0.08 below 0.15".
	Reason string
}

// Evaluate decides whether taskType, with stats s, is below the threshold
// on its own evidence: exempt types and types with fewer than MinOutcomes
// settled tasks are never Below. EvaluateWith adds the mesh's evidence.
func (p Policy) Evaluate(taskType string, s Stats) Verdict {
	return p.EvaluateWith(taskType, s, Prior{}, false)
}

// EvaluateWith decides whether taskType, with stats s, is below the
// threshold (SPEC §4), prior being what the mesh knows (PriorOf):
//
//   - with MinOutcomes settled tasks or more, on its own score;
//   - with fewer, on its own score shrunk toward prior (Prior.Shrink) when
//     the prior is known and the type has at least one task: a new type
//     in a mesh whose types are healthy is presumed healthy, one in a mesh
//     where types are either healthy or hopeless is judged on its first
//     tasks; without a prior it is not gated (its canaries go first);
//   - never while a probe's success has re-opened it (Opened).
//
// settledOnly scores only the tasks whose result is final: a retry is
// judged on them, so a ladder is not stopped by its siblings' first
// failures while they are still climbing (a type whose tasks need a
// retry). A new task is judged on every task, the climbing ones counting
// as failed so far: a regression shows at once.
func (p Policy) EvaluateWith(taskType string, s Stats, prior Prior, settledOnly bool) Verdict {
	p = p.WithDefaults()
	folded := s.Folded() // the window, its settled tasks and the run test read it
	all := p.window(folded, false)
	rs := all
	if settledOnly {
		rs = p.window(folded, true)
	}
	own, _, _ := scoreTasks(rs, p)
	v := Verdict{
		Score:     own,
		Outcomes:  len(rs),
		Threshold: p.Threshold,
		Exempt:    p.Exempted(taskType),
		Opened:    openedByProbe(all),
	}
	for _, r := range all {
		if r.Settled() {
			v.Settled++
		}
	}
	for _, r := range rs {
		if r.Success {
			v.Successes++
		} else {
			v.Failures++
		}
	}
	v.Unproven = v.Settled < p.MinOutcomes
	scored := !v.Unproven
	if v.Unproven && prior.Known() && len(rs) > 0 {
		v.Prior, v.Score, scored = prior, prior.Shrink(own, len(rs)), true
	}
	runPrior := prior // the run test reads the prior only while the type is unproven
	if !v.Unproven {
		runPrior = Prior{}
	}
	run, changed, pooled := failedRun(all, p.RunAlpha, p.MinOutcomes, runPrior)
	low := !v.Exempt && p.Threshold >= 0 && ((scored && v.Score < p.Threshold) || changed)
	v.Below, v.Probation = low && !v.Opened, low && v.Opened
	switch {
	case !v.Below:
	case scored && v.Score < p.Threshold:
		v.Reason = fmt.Sprintf("Blocked: %s trust score %.2f below %.2f", taskType, v.Score, p.Threshold)
		if v.Prior.Known() {
			v.Reason += fmt.Sprintf(" (%d tasks of its own, pooled with %d types' rate %.2f)", len(rs), v.Prior.Types, v.Prior.Mean)
		}
	default:
		v.Run = run
		v.Reason = fmt.Sprintf("Blocked: %s trust score %.2f: its last %d tasks failed, unlikely at its rate before (a regression?)", taskType, v.Score, run)
		if pooled {
			v.Reason = fmt.Sprintf("Blocked: %s trust score %.2f: its last %d tasks failed, unlikely at its rate before pooled with %d other types' rate %.2f", taskType, v.Score, run, prior.Types, prior.Mean)
		}
	}
	return v
}

// PriorOf is the prior of taskType from pool as p lets it count.
func (p Policy) PriorOf(pool *Pool, taskType string) Prior { return p.prior(pool.Prior(taskType)) }

// CanariesWith is how many canaries of an unproven type may be in flight
// given the prior: the Sample that decides the type in one round (at least
// 2), at most p.Canary; p.Canary without a prior.
func (p Policy) CanariesWith(prior Prior) int {
	p = p.WithDefaults()
	if p.Canary < 0 || !prior.Known() {
		return p.Canary
	}
	return min(p.Canary, max(2, prior.Sample(p.Threshold)))
}

// prior is the prior p lets count: PriorWeight negative drops it, positive
// sets its weight.
func (p Policy) prior(pr Prior) Prior {
	switch {
	case p.PriorWeight < 0:
		return Prior{}
	case p.PriorWeight > 0 && pr.Types > 0:
		pr.Weight = p.PriorWeight
	}
	return pr
}

func lastN[T any](s []T, n int) []T {
	if n >= 0 && len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
