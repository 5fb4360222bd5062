package recorder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// ActionFilter matches the human review actions, dispatch.review.action.<id>.
var ActionFilter = events.ReviewSubject(events.ReviewAction, "*")

// actionWait bounds the read of a task's state for an action heard.
const actionWait = 10 * time.Second

// hearActions subscribes to the review actions in queue group "recorder":
// each action is counted by one recorder instance.
func (s *Service) hearActions(nc *nats.Conn) error {
	sub, err := nc.QueueSubscribe(ActionFilter, services.ConsumerRecorder, func(m *nats.Msg) {
		ctx, cancel := context.WithTimeout(context.Background(), actionWait)
		defer cancel()
		s.HandleAction(ctx, m.Subject, m.Data)
	})
	if err != nil {
		return fmt.Errorf("recorder: subscribe to the review actions: %w", err)
	}
	s.actions = sub
	return nil
}

// HandleAction counts the task a human's review action ended — a resolve
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
// It is counted as it is published, by the recorder instance that hears
// it (a core subscription in a queue group, not a consumer: the recorder's
// durable keeps one filter, see Spec). That is an approximation — an action
// published while no recorder runs, or whose task's state cannot be read,
// is never counted — which keeps the recorder from writing anything to
// remember what it counted.
func (s *Service) HandleAction(ctx context.Context, subject string, data []byte) {
	var a events.Action
	if err := json.Unmarshal(data, &a); err != nil || !events.ValidID(a.TaskID) {
		// Not the review client's: nothing to count, and nothing a reviewer
		// could act on either.
		s.log.Warn("review action that does not decode: not counted", "subject", subject, "err", err)
		return
	}
	ended := task.Act(events.TaskState{}, a).Status
	if !events.Terminal(ended) {
		return // a requeue: the task runs again
	}
	st, err := s.cfg.Tasks.Get(ctx, a.TaskID)
	if errors.Is(err, services.ErrTaskNotFound) {
		return
	}
	if err != nil {
		s.log.Warn("review action: task state unreadable, the end is not counted", "task", a.TaskID, "action", a.Action, "err", err)
		return
	}
	if !holds(st, a) {
		s.log.Info("review action the task state does not hold (reverted): not counted", "task", a.TaskID, "action", a.Action)
		return
	}
	s.metrics.tasks.Finish(st.Type, ended, services.EndedByHuman, a.At.Sub(st.CreatedAt))
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
