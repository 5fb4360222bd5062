package services

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/internal/kvcas"
)

// ErrTaskNotFound is returned for an unknown task id.
var ErrTaskNotFound = errors.New("task not found")

// TaskStore keeps each task's current state in the dispatch_tasks bucket.
type TaskStore struct {
	kv jetstream.KeyValue
}

// NewTaskStore wraps the task bucket.
func NewTaskStore(kv jetstream.KeyValue) *TaskStore { return &TaskStore{kv: kv} }

// Get returns a task's state.
func (s *TaskStore) Get(ctx context.Context, id string) (events.TaskState, error) {
	st, _, found, err := kvcas.Get[events.TaskState](ctx, s.kv, id)
	if err == nil && !found {
		err = ErrTaskNotFound
	}
	return st, err
}

// Watch watches a task's state: its current value (if any), then every
// change, on w.Updates(); a nil entry marks the end of the current value.
// Stop w when done.
func (s *TaskStore) Watch(ctx context.Context, id string) (jetstream.KeyWatcher, error) {
	return s.kv.Watch(ctx, id)
}

// WatchAll watches every task's state: each change stored after it
// starts (no current values), on w.Updates(). Stop w when done.
func (s *TaskStore) WatchAll(ctx context.Context) (jetstream.KeyWatcher, error) {
	return s.kv.WatchAll(ctx, jetstream.UpdatesOnly())
}

// Update changes a task's state with a compare-and-set loop (see kvcas.Update).
// found is false when the task has no state yet.
func (s *TaskStore) Update(ctx context.Context, id string, mutate func(st *events.TaskState, found bool) error) (events.TaskState, error) {
	return kvcas.Update(ctx, s.kv, id, mutate)
}

// Create stores the state of a new task. If the task exists it returns
// false and the stored state instead.
func (s *TaskStore) Create(ctx context.Context, st events.TaskState) (bool, events.TaskState, error) {
	data, err := json.Marshal(st)
	if err != nil {
		return false, st, err
	}
	_, err = s.kv.Create(ctx, st.ID, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		existing, err := s.Get(ctx, st.ID)
		return false, existing, err
	}
	return err == nil, st, err
}

// SetStatus moves a task to status for the given pass, unless the state has
// moved past that pass or the task already ended: a late redelivery of an old
// message never rewinds a task. It returns the state after the change.
func (s *TaskStore) SetStatus(ctx context.Context, b events.Base, status, reason string) (events.TaskState, error) {
	st, _, err := s.SetStatusChanged(ctx, b, status, reason)
	return st, err
}

// SetStatusChanged is SetStatus that also reports whether this call made the
// change (false for a redelivery, or a task that moved on): what ends a task
// is counted once.
func (s *TaskStore) SetStatusChanged(ctx context.Context, b events.Base, status, reason string) (st events.TaskState, changed bool, err error) {
	st, err = s.Update(ctx, b.Task.ID, func(st *events.TaskState, found bool) error {
		changed = false
		if found && (st.Pass > b.Run.Pass || events.Terminal(st.Status) || st.Status == status) {
			return kvcas.ErrNoChange
		}
		if !found {
			*st = NewState(b.Task)
		}
		st.Status, st.Pass, st.UpdatedAt = status, b.Run.Pass, b.At
		if reason != "" {
			st.Reason = reason
		}
		changed = true
		return nil
	})
	return st, changed && err == nil, err
}

// Ended reports whether the task has ended (a terminal status): a service
// that finds it so acts no more on the task. An unknown task has not ended.
func (s *TaskStore) Ended(ctx context.Context, id string) (bool, events.TaskState, error) {
	st, err := s.Get(ctx, id)
	if errors.Is(err, ErrTaskNotFound) {
		return false, st, nil
	}
	return err == nil && events.Terminal(st.Status), st, err
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

// NewState is the state of a task that has just been accepted.
func NewState(t events.Task) events.TaskState {
	return events.TaskState{
		ID: t.ID, Type: t.Type, Subject: t.Subject, Status: events.StatusPending,
		Pass: 1, CreatedAt: t.SubmittedAt, UpdatedAt: t.SubmittedAt,
	}
}

// ApplyAction folds a human review action into a task's state. Requeue
// starts a new round: the task gets a full attempt allowance again, on REFINE.
func ApplyAction(st *events.TaskState, a events.Action) {
	st.Actions = append(st.Actions, a)
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
		st.RoundStart, st.Pass, st.Rung = st.Attempts, st.Pass+1, events.RungRefine
		st.WakeAt = time.Time{}
		st.Skips, st.StepRetries, st.Loops = 0, nil, nil // fresh pipeline budgets too
	}
}
