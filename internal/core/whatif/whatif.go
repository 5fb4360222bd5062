// Package whatif re-decides a recorded history under a candidate policy:
// it folds the events of the DISPATCH stream, in stream order, through the
// same pure decisions the services make — the gate's task.Decide (its
// claims answered by an in-memory copy of the type's gate facts) and the
// recorder's task.Record — and tallies what happened (actual) against what
// the candidate would have done (what-if).
//
// An attempt the candidate runs and the history holds is a replayed fact:
// its recorded result, tokens and cost. An attempt the candidate would
// have run that never ran is an estimate: from the type's measured success
// rate on the attempt's rung and its mean cost per attempt, both as the
// history measured them up to that moment (Estimated, kept apart from the
// facts). See docs/whatif.md.
//
// The package reads no stream: internal/ops/whatif decodes the events.
package whatif

import (
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

// Kind is what a recorded event tells the replay.
type Kind string

const (
	KindQueued    Kind = "queued"    // a task's first event (queued, or verified at intake)
	KindVerified  Kind = "verified"  // a pass reaches the gate: Base.Run is the gate's input
	KindAdmitted  Kind = "admitted"  // the gate let the pass through
	KindHeld      Kind = "held"      // the gate held the pass for its type's trust
	KindGated     Kind = "gated"     // the gate sent the task to a human
	KindHandoff   Kind = "handoff"   // the gate handed the task off (rung_rate)
	KindExecuted  Kind = "executed"  // an attempt's result
	KindSucceeded Kind = "succeeded" // the recorder: done
	KindEscalated Kind = "escalated" // the recorder handed the task off
	KindStuck     Kind = "stuck"     // the recorder: skip budget spent
	KindCancelled Kind = "cancelled" // the verifier: stale
	KindRetry     Kind = "retry"     // the recorder's retry, or a human's requeue (Run.Reviewed)
	KindAction    Kind = "action"    // a human's action
)

// Event is one recorded event as the replay reads it.
type Event struct {
	Kind Kind
	Base events.Base
	// Stored is when the stream stored it (the recorder dates an attempt so).
	Stored time.Time
	Trust  events.TrustDecision
	Hold   events.Hold
	Result events.Result
	Reason string
	Action events.Action
}

// Options of a what-if replay.
type Options struct {
	// Policy is the candidate: every decision is made under it.
	Policy *policy.File
	// Revision names the candidate in the report (0: a file).
	Revision uint64
	// Scoring is the mesh's trust scoring (the pool is scored under it).
	Scoring scoring.Policy
	// Since: only tasks whose first event is at or after it are reported;
	// every event still feeds the replayed trust. Zero: all.
	Since time.Time
	// Type, when set, reports that type only.
	Type string
	// End is when the history ends: the last look at passes the candidate
	// holds. Zero: the last event's time.
	End time.Time
}

// Figures are a side's replayed facts.
type Figures struct {
	Tokens   int64   `json:"tokens"`
	Cost     float64 `json:"cost"`
	Resolved int     `json:"resolved"`
	ToHuman  int     `json:"to_human"`
	Held     int     `json:"held"`
	Attempts int     `json:"attempts"`
}

// Estimated is what the attempts the candidate would have run, and the
// history never ran, are expected to add: expected values, so fractional.
type Estimated struct {
	Tokens   float64 `json:"tokens"`
	Cost     float64 `json:"cost"`
	Resolved float64 `json:"resolved"`
	ToHuman  float64 `json:"to_human"`
	Attempts float64 `json:"attempts"`
	// Tasks is how many tasks are (partly) estimated.
	Tasks int `json:"tasks"`
}

// WhatIf is the candidate's side: replayed facts, and apart from them the
// estimates. Its prediction is the sum of the two.
type WhatIf struct {
	Figures
	Estimated Estimated `json:"estimated"`
}

// TypeReport is one type's figures.
type TypeReport struct {
	Tasks  int     `json:"tasks"`
	Actual Figures `json:"actual"`
	WhatIf WhatIf  `json:"whatif"`
}

// Fate is how a task ended (or stands at the end of the history) on one
// side, and the decision that made it so.
type Fate struct {
	// Fate is resolved, to_human, held, cancelled, in_flight or estimated.
	Fate string `json:"fate"`
	// Decision is the deciding act: succeeded, handoff, block, hold,
	// cancelled, admit (in flight), or estimate.
	Decision string `json:"decision"`
	// Cause is the typed cause: a gate cause (events.Cause), or the
	// recorder's: ladder (its attempts ran out), budget_task, stuck.
	Cause    string  `json:"cause,omitempty"`
	Reason   string  `json:"reason,omitempty"`
	Attempts int     `json:"attempts"`
	Tokens   int64   `json:"tokens"`
	Cost     float64 `json:"cost"`
	// Resolve is the estimated chance the task resolves (Fate estimated).
	Resolve float64 `json:"resolve,omitempty"`
}

// Change is a task whose fate or number of attempts differs.
type Change struct {
	ID     string `json:"id"`
	Type   string `json:"type"`
	Actual Fate   `json:"actual"`
	WhatIf Fate   `json:"whatif"`
	// Cause says what changed it: the what-if decision that parted from
	// the recorded one.
	Cause string `json:"cause"`
}

// Report is a what-if replay's answer.
type Report struct {
	Since          time.Time             `json:"since"`
	PolicyRevision uint64                `json:"policy_revision"`
	Tasks          int                   `json:"tasks"`
	Actual         Figures               `json:"actual"`
	WhatIf         WhatIf                `json:"whatif"`
	ByType         map[string]TypeReport `json:"by_type"`
	Changed        []Change              `json:"changed"`
}

// Fates.
const (
	FateResolved  = "resolved"
	FateToHuman   = "to_human"
	FateHeld      = "held"
	FateCancelled = "cancelled"
	FateInFlight  = "in_flight"
	FateEstimated = "estimated"
)
