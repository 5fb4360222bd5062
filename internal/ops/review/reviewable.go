package review

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

// ReviewStatuses are the task statuses a human can resolve, reject or
// requeue: the task stopped and nothing of it is in flight.
//
//	held                the gate holds it for its type's trust: it comes back by
//	                    itself when the type recovers, but a human may act first
//	needs_human_review  the gate blocked it (review.gated)
//	blocked             the ladder gave up (review.escalated) or the skip budget ran out (review.stuck)
//	failed              a human rejected it, or a pipeline failed it
//	cancelled           the verifier found it stale — a human may know better
//
// A task whose newest event is a poison or stuck record of its current pass
// is also actionable whatever its status says: the message carrying it was
// dead-lettered, so nothing of it is in flight. This is the one place that
// decides it, from the stream: the poison path writes no task state (the
// router cannot, and a second writer would be a second truth to rebuild). pending, verifying, running
// and parked tasks are in flight (parked ones come back by themselves) and
// succeeded ones are done: acting on them is refused with a StateError.
var ReviewStatuses = []events.Status{events.StatusHeld, events.StatusNeedsHumanReview, events.StatusBlocked, events.StatusFailed, events.StatusCancelled}

// StateError says why a task cannot be acted on now. It matches ErrNotReviewable.
// DecidedError is a decision refused because another human decided on the
// task after the decider looked (Client.DecideSeen): theirs stands until
// the decider has seen it.
type DecidedError struct {
	ID, Action string
	Latest     events.Action
}

func (e *DecidedError) Error() string {
	return fmt.Sprintf("cannot %s task %s: %s decided %s at %s since you looked (%q); reload it and decide again",
		e.Action, e.ID, e.Latest.By, e.Latest.Action, e.Latest.At.UTC().Format(time.RFC3339), textcut.Clip(e.Latest.Note, 200))
}

// Is makes a DecidedError an ErrNotReviewable (a conflict).
func (e *DecidedError) Is(target error) bool { return target == ErrNotReviewable }

type StateError struct {
	ID     string
	Action string
	Status events.Status
	Pass   int
	// Already is set when the same decision was the last thing that happened.
	Already *events.Action
}

func (e *StateError) Error() string {
	why := "it is not waiting for a human"
	switch {
	case e.Already != nil:
		return fmt.Sprintf("cannot %s task %s: %s by %s at %s already, and nothing happened since",
			e.Action, e.ID, e.Already.Action, e.Already.By, e.Already.At.UTC().Format(time.RFC3339))
	}
	switch e.Status {
	case events.StatusPending, events.StatusVerifying, events.StatusRunning:
		why = fmt.Sprintf("it is %s (pass %d): the mesh is working on it; act once it stops for review", e.Status, e.Pass)
	case events.StatusParked:
		why = "it is parked: it comes back by itself after its skip delay"
	case events.StatusSucceeded:
		why = "it already succeeded"
	}
	return fmt.Sprintf("cannot %s task %s: %s (actionable statuses: %s)", e.Action, e.ID, why, JoinStatuses(ReviewStatuses))
}

// JoinStatuses lists statuses as "a, b, c".
func JoinStatuses(statuses []events.Status) string {
	names := make([]string, len(statuses))
	for i, s := range statuses {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// Is makes errors.Is(err, ErrNotReviewable) true.
func (e *StateError) Is(target error) bool { return target == ErrNotReviewable }

// checkReviewable reports whether a human can act on st now; t is the newest
// event of the task on the stream.
func checkReviewable(st events.TaskState, t tail, action string) error {
	if n := len(st.Actions); n > 0 && st.Actions[n-1].Action == action && st.UpdatedAt.Equal(st.Actions[n-1].At) {
		last := st.Actions[n-1]
		return &StateError{ID: st.ID, Action: action, Status: st.Status, Pass: st.Pass, Already: &last}
	}
	if slices.Contains(ReviewStatuses, st.Status) || halted(st, t) {
		return nil
	}
	return &StateError{ID: st.ID, Action: action, Status: st.Status, Pass: st.Pass}
}

// halted: the task's newest event is a dead-letter record (poison, stuck…)
// of its current pass, so nothing of the task is in flight. The record's
// pass is its Dispatch-Pass header, else its body's; a record with neither
// (written before records carried the header, its body undecodable) counts
// as the current pass: nothing newer on the stream shows the task moving.
// A poisoned outcome whose recording already moved the task to its next
// pass (pending or parked, task.AsRecorded) halts it too: the recorder
// never published that pass, and nothing else will.
func halted(st events.TaskState, t tail) bool {
	reason, isReview := strings.CutPrefix(t.Stage, "review.")
	return isReview && reason != ReasonAction && reason != events.ReviewRejected &&
		st.Status != events.StatusSucceeded && (t.Pass == 0 || t.Pass >= st.Pass || task.AsRecorded(st, t.Pass))
}
