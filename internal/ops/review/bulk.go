package review

import (
	"context"
	"errors"
	"fmt"
)

// errNoTask is why a bulk requeue skips a record without a task.
var errNoTask = errors.New("no task state: the input never became a task")

// bulkPage is the page size of a bulk requeue (tests lower it).
var bulkPage = MaxPageSize

// RequeueEach requeues the task of every open review item of the type and
// reason (at least one of them is required), once per task, and tells done
// about each task as it goes: skipped is nil when it was requeued, else
// why not. It pages through the queue newest first (List, MaxPageSize
// items a page, following the cursor to the end: every matching record is
// read once, a human asked for all of them), so it holds one page in
// memory however many items match; a task requeued here has a decision
// after its older records, so an older page no longer lists them as open,
// and the records a requeued task gets meanwhile are newer than the cursor:
// they are not requeued again. It stops at the first error that is not
// about one task (the queue could not be read, ctx ended).
func (c *Client) RequeueEach(ctx context.Context, taskType, reason, note, by string, done func(id string, skipped error)) error {
	if taskType == "" && reason == "" {
		return fmt.Errorf("%w: a bulk requeue needs a type or a reason (or both)", ErrInvalid)
	}
	if err := validateInput(note, by); err != nil {
		return err
	}
	f := Filter{Type: taskType, Reason: reason, Limit: bulkPage}
	skipped := map[string]bool{} // a task whose requeue failed, met again at an older record
	for {
		q, err := c.List(ctx, f)
		if err != nil {
			return err
		}
		seen := map[string]bool{} // a task with two open records on the page
		for _, it := range q.Items {
			if seen[it.Key] || skipped[it.Key] {
				continue
			}
			seen[it.Key] = true
			if it.TaskID == "" {
				skipped[it.Key] = true
				done(it.Key, errNoTask)
				continue
			}
			if _, err := c.Requeue(ctx, it.TaskID, note, by); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				skipped[it.Key] = true
				done(it.TaskID, err)
				continue
			}
			done(it.TaskID, nil)
		}
		if q.Next == "" {
			return nil
		}
		f.Cursor = q.Next
	}
}
