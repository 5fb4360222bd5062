package services

import (
	"context"
	"errors"

	json "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
)

// ErrTaskNotFound is returned for an unknown task id.
var ErrTaskNotFound = errors.New("task not found")

// TaskStore keeps each task's current state in the dispatch_tasks bucket.
type TaskStore struct {
	kv     jetstream.KeyValue
	sealer *Sealer
}

// NewTaskStore wraps the task bucket.
func NewTaskStore(kv jetstream.KeyValue) *TaskStore { return &TaskStore{kv: kv} }

// Sealing returns the store with a Sealer: the state it writes can be
// sealed for the executor (Seal), and a sealed state opened (Open). Only a
// service that may write the state gets one (see Sealer).
func (s *TaskStore) Sealing(sl *Sealer) *TaskStore {
	if s == nil {
		return nil
	}
	c := *s
	c.sealer = sl
	return &c
}

// Seal seals a state this store wrote (at, as Create or ApplyAt returned
// it) for the executor; nil without a Sealer (see Sealer.Seal).
func (s *TaskStore) Seal(at events.StateAt) *events.Sealed { return s.sealer.Seal(at) }

// Open returns the state sealed in sd for task id, or nil (see
// Sealer.Open): ApplyAt then reads.
func (s *TaskStore) Open(id string, sd *events.Sealed) *events.StateAt { return s.sealer.Open(id, sd) }

// Get returns a task's state.
func (s *TaskStore) Get(ctx context.Context, id string) (events.TaskState, error) {
	st, _, found, err := kvcas.Get[events.TaskState](ctx, s.kv, id)
	if err == nil && !found {
		err = ErrTaskNotFound
	}
	return st, err
}

// Follow watches a task's state, with a consumer on js: its current value
// (if any), then every change, on w.Updates(); a nil entry marks the end
// of the current value. Stop w when done. Only what its own consumer
// delivered is passed on, read back from the bucket (follow.Watch): a
// message another consumer delivers into its inbox is logged and dropped.
func (s *TaskStore) Follow(ctx context.Context, js jetstream.JetStream, id string) (*follow.Watcher, error) {
	return follow.Watch(ctx, js, s.kv, id, follow.WatchOptions{})
}

// FollowAll watches every task's state, with a consumer on js (see
// Follow): each change stored after it starts (no current values, no nil
// entry), on w.Updates(). Stop w when done.
func (s *TaskStore) FollowAll(ctx context.Context, js jetstream.JetStream) (*follow.Watcher, error) {
	return follow.WatchAll(ctx, js, s.kv, follow.WatchOptions{UpdatesOnly: true})
}

// Update changes a task's state with a compare-and-set loop (see kvcas.Update).
// found is false when the task has no state yet.
func (s *TaskStore) Update(ctx context.Context, id string, mutate func(st *events.TaskState, found bool) error) (events.TaskState, error) {
	return kvcas.Update(ctx, s.kv, id, mutate)
}

// Create stores the state of a new task and returns it with its revision.
// If the task exists it returns false and the stored state instead.
func (s *TaskStore) Create(ctx context.Context, st events.TaskState) (bool, events.StateAt, error) {
	data, err := json.Marshal(st)
	if err != nil {
		return false, events.StateAt{State: st}, err
	}
	rev, err := s.kv.Create(ctx, st.ID, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		existing, rev, found, err := kvcas.Get[events.TaskState](ctx, s.kv, st.ID)
		if err == nil && !found {
			err = ErrTaskNotFound
		}
		return false, events.StateAt{Rev: rev, State: existing}, err
	}
	return err == nil, events.StateAt{Rev: rev, State: st}, err
}

// Apply runs the transition tr (a function of package task) on a task's
// state with one compare-and-set: the state is written only when tr
// changed it. It returns the state after the call and tr's cause.
func (s *TaskStore) Apply(ctx context.Context, id string, tr func(st events.TaskState, found bool) (events.TaskState, task.Cause)) (events.TaskState, task.Cause, error) {
	at, cause, err := s.ApplyAt(ctx, id, nil, tr)
	return at.State, cause, err
}

// ApplyAt is Apply starting from the state an event carried (known, nil:
// none; see events.StateAt): the compare-and-set is tried against its
// revision without reading the state, and reads it when another write came
// in between. It returns the state after the call with its revision, for
// the event this service publishes next.
func (s *TaskStore) ApplyAt(ctx context.Context, id string, known *events.StateAt, tr func(st events.TaskState, found bool) (events.TaskState, task.Cause)) (events.StateAt, task.Cause, error) {
	var (
		cause task.Cause
		from  *events.TaskState
		rev   uint64
	)
	if known != nil && known.State.ID == id {
		from, rev = &known.State, known.Rev
	}
	st, rev, err := kvcas.UpdateFrom(ctx, s.kv, id, from, rev, func(st *events.TaskState, found bool) error {
		next, c := tr(*st, found)
		cause = c
		if !c.Changed() {
			return kvcas.ErrNoChange
		}
		*st = next
		return nil
	})
	return events.StateAt{Rev: rev, State: st}, cause, err
}

// SetStatus moves a task to status for the given pass (task.SetStatus),
// unless the state has moved past that pass or the task already ended: a
// late redelivery of an old message never rewinds a task. It returns the
// state after the change.
func (s *TaskStore) SetStatus(ctx context.Context, b events.Base, status events.Status, reason string) (events.TaskState, error) {
	st, _, err := s.Apply(ctx, b.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.SetStatus(st, found, b, status, reason)
	})
	return st, err
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
