package task

import "github.com/dispatchmesh/dispatchmesh/events"

// Cause is what a transition did to a task's state, or why it did nothing.
// Its values are stable: they may be logged and compared, never parsed.
type Cause string

// The causes of a transition.
const (
	// CauseApplied: the transition changed the state.
	CauseApplied Cause = "applied"
	// CauseRedelivered: the state already shows this event (a redelivery,
	// or a stage that already holds the status): nothing to change.
	CauseRedelivered Cause = "redelivered"
	// CauseMovedOn: the state is at a later pass than the event's: a late
	// message never rewinds a task.
	CauseMovedOn Cause = "moved_on"
	// CauseEnded: the task has ended (a terminal status); only a human acts
	// on it now.
	CauseEnded Cause = "ended"
)

// Valid reports whether c is one of the causes above.
func (c Cause) Valid() bool {
	switch c {
	case CauseApplied, CauseRedelivered, CauseMovedOn, CauseEnded:
		return true
	}
	return false
}

// Changed reports whether the transition changed the state: the caller
// writes the new state (and counts what ended the task) only then.
func (c Cause) Changed() bool { return c == CauseApplied }

// guard is the rule every stage obeys: an event of an earlier pass, or one
// reaching a task that has ended, changes nothing.
func guard(st events.TaskState, pass int) (Cause, bool) {
	switch {
	case st.Pass > pass:
		return CauseMovedOn, false
	case events.Terminal(st.Status):
		return CauseEnded, false
	}
	return CauseApplied, true
}
