package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// waitSlice is how long one wait request asks the mesh to watch; Wait
// asks again until its ctx ends. Within events.MaxWaitTimeout.
const waitSlice = 5 * time.Minute

// Wait returns the task's outcome once its status is terminal — succeeded
// (Outcome.Result holds the final answer), cancelled, needs_human_review,
// blocked or failed. The mesh watches the task's state and answers when it
// changes: nothing polls. When ctx ends first, Wait returns where the task
// stood (Outcome.TimedOut, Status, Stage) with an error wrapping ctx.Err().
// A task rejected as invalid is an *Error matching ErrRejected, with its
// problems; an id no task appeared under before ctx ended, ErrNotFound.
func (c *Client) Wait(ctx context.Context, id string) (Outcome, error) {
	var stood Outcome // the latest answer
	retry := 100 * time.Millisecond
	for {
		slice, last := waitSlice, false
		if deadline, ok := ctx.Deadline(); ok {
			// The mesh answers a little before ctx ends, with where the task
			// is: a tenth of the time left (at most 2s), and at least a
			// third of it up to 250ms, so a short deadline on a busy
			// machine still gets the answer back in time.
			left := time.Until(deadline)
			margin := min(max(left/10, min(left/3, 250*time.Millisecond)), 2*time.Second)
			if s := left - margin; s < slice {
				slice, last = max(s, time.Millisecond), true
			}
		}
		body, err := taskRequest(id, slice)
		if err != nil {
			return stood, err
		}
		rctx, cancel := context.WithTimeout(ctx, slice+5*time.Second)
		var out Outcome
		err = c.request(rctx, events.APIWait, body, &out)
		cancel()
		switch {
		case ctx.Err() != nil:
			return stood, gaveUp(id, stood, ctx.Err())
		case errors.Is(err, ErrUnavailable): // stopping, busy, restarting: ask again
			if !sleep(ctx, retry) {
				return stood, gaveUp(id, stood, ctx.Err())
			}
			retry = min(2*retry, 2*time.Second)
			continue
		case err != nil:
			return stood, err
		}
		stood = out
		switch {
		case !out.TimedOut:
			return out, nil
		case last || ctx.Err() != nil: // ctx ends now
			cause := ctx.Err()
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			return stood, gaveUp(id, stood, cause)
		}
	}
}

func gaveUp(id string, stood Outcome, cause error) error {
	if stood.Status == "" {
		return fmt.Errorf("task %s: gave up waiting: %w", id, cause)
	}
	return fmt.Errorf("task %s is still %s (stage %s): gave up waiting: %w", id, stood.Status, stood.Stage, cause)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
