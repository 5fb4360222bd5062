package spend

import "github.com/dispatchmesh/dispatchmesh/events"

// NoRung labels the attempts that ran on no escalation rung: pipeline steps
// (and records from before rungs were kept).
const NoRung = "none"

// RungLabel names an attempt's rung for a table or a metric label: the rung,
// or NoRung.
func RungLabel(rung events.Rung) string {
	if rung == "" {
		return NoRung
	}
	return string(rung)
}

// Resolved reports whether a task in this status is resolved: succeeded,
// whether the mesh or a human's resolve finished it.
func Resolved(status events.Status) bool { return status == events.StatusSucceeded }

// Unresolved reports whether a task in this status ended without being
// resolved: blocked, failed, needs_human_review or cancelled. What such a
// task spent bought nothing (a human may still requeue or resolve it, and
// then the task counts again by its new status). A cancelled task was stale
// and usually spent nothing; one cancelled on a later pass did spend.
func Unresolved(status events.Status) bool {
	return events.Terminal(status) && !Resolved(status)
}

// Retry reports whether attempt h[i] of a task's history is a retry: an
// attempt made after a failed one (h[i-1] failed). On the escalation ladder
// that is every attempt after a task's first, since a success ends the
// task; in a pipeline the attempt after a passed step is progress, not a
// retry, and the one after a failed step (a retry of the step, a goto back,
// the return after a skip) is.
func Retry(h []events.AttemptRecord, i int) bool {
	return i > 0 && i < len(h) && h[i-1].Outcome != events.OutcomeSuccess
}

// SameError reports whether attempt h[i] failed with the very reason of the
// task's previous failed attempt (the nearest failed one before it, passed
// pipeline steps in between do not matter): a retry that learned nothing.
func SameError(h []events.AttemptRecord, i int) bool {
	if i < 0 || i >= len(h) || h[i].Outcome == events.OutcomeSuccess || h[i].Reason == "" {
		return false
	}
	for j := i - 1; j >= 0; j-- {
		if h[j].Outcome != events.OutcomeSuccess {
			return h[j].Reason == h[i].Reason
		}
	}
	return false
}

// Refused reports whether an attempt's request was never sent because it
// repeated a request that had already failed deterministically.
func Refused(r events.AttemptRecord) bool { return r.ErrorClass == events.ErrorClassRefused }

// refusedOf counts a task's refused requests: its attempt records of class
// refused. A task none of whose records carries an error class was recorded
// before records kept one; its TaskState.Refused counts instead, capped at
// its failed attempts (the executor counts a refusal again when the prompt
// is redelivered, a record is made once).
func refusedOf(st *events.TaskState) int {
	n, classed, failed := 0, false, 0
	for _, r := range st.History {
		classed = classed || r.ErrorClass != ""
		if Refused(r) {
			n++
		}
		if r.Outcome != events.OutcomeSuccess {
			failed++
		}
	}
	if classed {
		return n
	}
	return min(st.Refused, failed)
}

// Round is the attempts and spend of a task's current round: the attempts
// after st.RoundStart (a human's requeue starts a new round). Counting a
// finished round once, the recorder's metrics never count a requeued task's
// earlier spend twice.
func Round(st *events.TaskState) (attempts int, spent events.Usage) {
	for _, r := range st.History {
		if r.Attempt > st.RoundStart {
			attempts++
			spent = spent.Add(events.Usage{TokensIn: r.TokensIn, TokensOut: r.TokensOut, Cost: r.Cost})
		}
	}
	return attempts, spent
}
