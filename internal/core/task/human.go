package task

import (
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Act folds a human review action into a task's state (SPEC §9): resolve
// (succeeded), reject (failed), cancel (cancelled) or requeue. Requeue
// starts a new round: the task gets a full attempt allowance again, on
// REFINE, with no PIVOT attempts counted, its own RESEARCH pass (the
// ladder reads the round's dead ends for it) and fresh pipeline budgets;
// the dead ends stay, what failed before still failed. The review commands
// check whether the action is allowed; Act only applies it.
func Act(st events.TaskState, a events.Action) events.TaskState {
	st.Actions = append(st.Actions[:len(st.Actions):len(st.Actions)], a)
	st.UpdatedAt = a.At
	who := a.By
	if a.Note != "" {
		who += ": " + a.Note
	}
	switch a.Action {
	case events.ActionResolve:
		st.Status, st.Reason = events.StatusSucceeded, "resolved by "+who
	case events.ActionReject:
		st.Status, st.Reason = events.StatusFailed, "rejected by "+who
	case events.ActionCancel:
		st.Status, st.Reason = events.StatusCancelled, "cancelled by "+who
		st.Resume, st.WakeAt = nil, time.Time{}
	case events.ActionRequeue:
		st.Status, st.Reason, st.Decision, st.Cause = events.StatusPending, "", "", ""
		st.RoundStart, st.Pass, st.Rung, st.PivotCount = st.Attempts, st.Pass+1, events.RungRefine, 0
		st.WakeAt = time.Time{}
		st.Skips, st.StepRetries, st.Loops = 0, nil, nil // fresh pipeline budgets too
	}
	return st
}

// EndedByHuman reports whether a human ended the task — cancelled,
// resolved or rejected it, and it still has the status that gave — as
// opposed to a stage of the mesh (the verifier finding it stale, the gate
// or the recorder stopping it), which republishes its record on a
// redelivery. A stage skips a task a human ended.
func EndedByHuman(st events.TaskState) bool {
	n := len(st.Actions)
	if n == 0 {
		return false
	}
	switch st.Actions[n-1].Action {
	case events.ActionCancel:
		return st.Status == events.StatusCancelled
	case events.ActionResolve:
		return st.Status == events.StatusSucceeded
	case events.ActionReject:
		return st.Status == events.StatusFailed
	}
	return false
}
