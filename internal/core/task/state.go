package task

import "github.com/dispatchmesh/dispatchmesh/events"

// New is the state of a task that has just been accepted (submitted).
func New(t events.Task) events.TaskState {
	return events.TaskState{
		ID: t.ID, Type: t.Type, Subject: t.Subject, Status: events.StatusPending,
		Pass: 1, CallbackURL: t.CallbackURL, CreatedAt: t.SubmittedAt, UpdatedAt: t.SubmittedAt,
	}
}

// Queued is the state intake creates for a task it queues: New, starting
// on the run's rung and step, and knowing the submission's stream sequence.
func Queued(t events.Task, run events.Run, submitSeq uint64) events.TaskState {
	st := New(t)
	st.SubmitSeq, st.Rung, st.Step = submitSeq, run.Rung, run.Step
	return st
}

// SetStatus moves a task to status for the pass b.Run.Pass, unless the
// state has moved past that pass, the task has ended, or it already holds
// status (a redelivery): a late message never rewinds a task. A non-empty
// reason replaces the state's.
func SetStatus(st events.TaskState, found bool, b events.Base, status events.Status, reason string) (events.TaskState, Cause) {
	if found {
		if c, ok := guard(st, b.Run.Pass); !ok {
			return st, c
		}
		if st.Status == status {
			return st, CauseRedelivered
		}
	} else {
		st = New(b.Task)
	}
	st.Status, st.Pass, st.UpdatedAt = status, b.Run.Pass, b.At
	if reason != "" {
		st.Reason = reason
	}
	return st, CauseApplied
}

// Verifying: the verifier takes the task for pass b.Run.Pass (SetStatus).
func Verifying(st events.TaskState, found bool, b events.Base) (events.TaskState, Cause) {
	return SetStatus(st, found, b, events.StatusVerifying, "")
}

// Cancel: the verifier found the task stale, or its verifier failed closed
// (SPEC §3): the task is cancelled with the verification's reason.
func Cancel(st events.TaskState, found bool, b events.Base, v events.Verification) (events.TaskState, Cause) {
	return SetStatus(st, found, b, events.StatusCancelled, CancelReason(v))
}

// CancelReason is the task-state reason of a task the verifier cancelled.
func CancelReason(v events.Verification) string {
	if v.Verdict == events.VerdictStale {
		return "stale: " + v.Detail
	}
	return "verifier error (fail-closed): " + v.Detail
}

// stop applies a transition that ends the task's pass, under the guard; a
// redelivery finds the task ended and changes nothing (its record is
// republished as it was): what ends a task is counted once.
func stop(st events.TaskState, found bool, b events.Base, end func(st *events.TaskState)) (events.TaskState, Cause) {
	if found {
		if c, ok := guard(st, b.Run.Pass); !ok {
			return st, c
		}
	} else {
		st = New(b.Task)
	}
	end(&st)
	st.Pass, st.UpdatedAt = b.Run.Pass, b.At
	return st, CauseApplied
}

// Block: the gate stopped the task for a human's review (SPEC §4): status
// needs_human_review, with the gate's reason and cause.
func Block(st events.TaskState, found bool, b events.Base, reason string, cause events.Cause) (events.TaskState, Cause) {
	return stop(st, found, b, func(st *events.TaskState) {
		st.Status, st.Reason, st.Cause = events.StatusNeedsHumanReview, reason, cause
	})
}

// Hold: the gate holds the task for its type's low trust (SPEC §4):
// status held, with the gate's reason — not terminal, its pass goes on
// when the gate re-admits it. A pass already held changes nothing.
func Hold(st events.TaskState, found bool, b events.Base, reason string) (events.TaskState, Cause) {
	if found {
		if c, ok := guard(st, b.Run.Pass); !ok {
			return st, c
		}
		if st.Status == events.StatusHeld && st.Pass == b.Run.Pass {
			return st, CauseRedelivered
		}
		if st.Pass == b.Run.Pass && (st.Status == events.StatusRunning || Attempted(st, b.Run.Pass)) {
			return st, CauseMovedOn // admitted already: a redelivery of what decided so
		}
	} else {
		st = New(b.Task)
	}
	st.Status, st.Reason, st.Cause = events.StatusHeld, reason, events.CauseTrust
	st.Pass, st.UpdatedAt = b.Run.Pass, b.At
	return st, CauseApplied
}

// Held reports whether st shows pass held by the gate.
func Held(st events.TaskState, pass int) bool {
	return st.Status == events.StatusHeld && st.Pass == pass
}

// HandOff: the gate stopped the task before an attempt that would rarely
// succeed: status blocked, the end of its ladder (cause rung_rate).
func HandOff(st events.TaskState, found bool, b events.Base, reason string) (events.TaskState, Cause) {
	return stop(st, found, b, func(st *events.TaskState) {
		st.Status, st.Decision, st.Reason, st.Rung = events.StatusBlocked, events.DecisionHandoff, reason, events.RungHandoff
		st.Cause = events.CauseRungRate
	})
}

// Attempted reports whether st records an attempt of pass: the gate let
// that pass through and its attempt ran.
func Attempted(st events.TaskState, pass int) bool {
	_, ok := recordOf(&st, pass)
	return ok
}
