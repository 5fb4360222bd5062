package recorder

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"dispatchmesh/events"
	"dispatchmesh/internal/task"
	"dispatchmesh/services"
)

// ActionFilter matches the human review actions, dispatch.review.action.<id>.
var ActionFilter = events.ReviewSubject(events.ReviewAction, "*")

var actionPrefix = events.ReviewSubject(events.ReviewAction, "")

func isAction(subject string) bool { return strings.HasPrefix(subject, actionPrefix) }

// action counts the task a human's review action ended — a resolve
// (succeeded), a reject (failed), a cancel (cancelled) — in
// dispatch_tasks_finished_total and dispatch_task_seconds with by="human",
// so that every end of a task is counted once by the mesh: the stages count
// the ends they make, and no stage sees these. A requeue ends nothing. It
// writes nothing and publishes nothing.
//
// The action is read back from the task's state — the type, and the
// submission the time is measured from — and counted only when the state
// holds it: the review client writes the state before it publishes the
// action, and reverts the state when the publish fails, which leaves a void
// record on the stream. A record without a task (rejected input, which never
// became a task) counts nothing.
//
// It is counted on the action's first delivery only: a redelivery (after a
// crash, or a failed ack) counts nothing again. That is an approximation —
// a first delivery whose instance died before it counted, or that could not
// read the task's state, is never counted — which keeps the recorder from
// writing anything to remember what it counted.
func (s *Service) action(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	if m.Delivered > 1 {
		return nil, nil
	}
	var a events.Action
	if err := json.Unmarshal(m.Data, &a); err != nil || !events.ValidID(a.TaskID) {
		// Not the review client's: nothing to count, and nothing a reviewer
		// could act on either.
		s.log.Warn("review action that does not decode: not counted", "subject", m.Subject, "seq", m.Seq, "err", err)
		return nil, nil
	}
	ended := task.Act(events.TaskState{}, a).Status
	if !events.Terminal(ended) {
		return nil, nil // a requeue: the task runs again
	}
	st, err := s.cfg.Tasks.Get(ctx, a.TaskID)
	if errors.Is(err, services.ErrTaskNotFound) {
		return nil, nil
	}
	if err != nil {
		s.log.Warn("review action: task state unreadable, the end is not counted", "task", a.TaskID, "action", a.Action, "err", err)
		return nil, nil
	}
	if !holds(st, a) {
		s.log.Info("review action the task state does not hold (reverted): not counted", "task", a.TaskID, "action", a.Action)
		return nil, nil
	}
	s.metrics.tasks.Finish(st.Type, ended, services.EndedByHuman, a.At.Sub(st.CreatedAt))
	return nil, nil
}

// holds reports whether st records action a.
func holds(st events.TaskState, a events.Action) bool {
	for _, b := range st.Actions {
		if b.Action == a.Action && b.By == a.By && b.Note == a.Note && b.At.Equal(a.At) {
			return true
		}
	}
	return false
}
