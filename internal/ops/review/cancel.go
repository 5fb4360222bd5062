package review

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nuid"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
)

// ErrEnded: the task to cancel has already ended with another status
// (succeeded, failed, blocked, needs_human_review): there is nothing to stop.
var ErrEnded = errors.New("review: task has already ended")

// Cancellable reports whether a task in this status can be cancelled: it
// has not ended (pending, verifying, running, parked).
func Cancellable(status events.Status) bool { return !events.Terminal(status) }

// Cancel stops a task that has not ended: its state becomes cancelled (a
// terminal status; the reason names who cancelled it and why) with one
// compare-and-set, then the action is published on
// dispatch.review.action.<id>. From the state write on, nothing of the task
// runs again: the verifier, the gate and the executor check the status
// before acting, an executor with the task in flight watches its state and
// abandons the model call (not recorded as an attempt, not retried), and
// the recorder ignores an outcome that arrives after the cancel.
//
// Cancel is idempotent: cancelling a cancelled task changes nothing and
// returns its state with Already set. A task that ended otherwise is not
// touched: ErrEnded. The note is optional.
func (c *Client) Cancel(ctx context.Context, id, note, by string) (Decision, error) {
	if !events.ValidID(id) {
		return Decision{}, fmt.Errorf("%w: task id %q", ErrInvalid, id)
	}
	note, by = strings.TrimSpace(note), strings.TrimSpace(by)
	switch {
	case by == "":
		return Decision{}, fmt.Errorf("%w: who acts is required", ErrInvalid)
	case len(note) > MaxNoteLen:
		return Decision{}, fmt.Errorf("%w: the note is %d bytes, limit %d", ErrInvalid, len(note), MaxNoteLen)
	}
	if err := ValidateBy(by); err != nil {
		return Decision{}, err
	}
	tasks, err := c.taskStore(ctx)
	if err != nil {
		return Decision{}, err
	}
	// The decision commits as a whole, even if the caller goes away.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	a := events.Action{TaskID: id, Action: events.ActionCancel, Note: note, By: by, At: c.cfg.Now().UTC()}
	var prev events.TaskState
	already := false
	next, err := tasks.Update(ctx, id, func(cur *events.TaskState, found bool) error {
		already = false
		switch {
		case !found:
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		case cur.Status == events.StatusCancelled:
			already = true
			return kvcas.ErrNoChange
		case !Cancellable(cur.Status):
			return fmt.Errorf("%w: task %s is %s", ErrEnded, id, cur.Status)
		}
		prev = *cur
		*cur = task.Act(*cur, a) // as dispatch rebuild replays it
		return nil
	})
	if err != nil {
		return Decision{}, err
	}
	if already {
		return Decision{Task: &next, Already: true}, nil
	}
	if err := c.publishAction(ctx, a, nuid.Next()); err != nil {
		return Decision{}, c.revert(ctx, tasks, prev, next, fmt.Errorf("cancel of %s did not take effect: %w", id, err))
	}
	c.cfg.Log.Info("task cancelled", "task", id, "by", by, "note", textcut.Clip(note, 200), "was", prev.Status)
	return Decision{Action: a, Task: &next}, nil
}
