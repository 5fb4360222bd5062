package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

// flights are the attempts this instance runs, by task id. A human's cancel
// (the review action a cancel publishes on dispatch.review.action.<id>,
// heard on one subscription per instance) ends their calls: an in-flight
// model call costs a goroutine blocked on I/O and a map entry, nothing on
// the server.
//
// An attempt is registered before the ledger reads the task's state, and a
// cancel stores the state before it publishes the action: a cancel that
// comes before the registration is seen by that read (the task is skipped),
// one that comes after it ends the call.
type flights struct {
	mu     sync.Mutex
	byTask map[string]map[*flight]struct{}
	sub    *nats.Subscription // the cancels heard; ended by Close
}

// close stops listening for cancels.
func (f *flights) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sub != nil {
		_ = f.sub.Unsubscribe()
		f.sub = nil
	}
}

type flight struct {
	cancel context.CancelFunc
	fired  atomic.Bool
}

// track registers an attempt of task id: ctx ends when the task is
// cancelled, ended reports whether it was, done unregisters it.
func (f *flights) track(ctx context.Context, id string) (_ context.Context, ended func() bool, done func()) {
	ctx, cancel := context.WithCancel(ctx)
	fl := &flight{cancel: cancel}
	f.mu.Lock()
	if f.byTask == nil {
		f.byTask = map[string]map[*flight]struct{}{}
	}
	if f.byTask[id] == nil {
		f.byTask[id] = map[*flight]struct{}{}
	}
	f.byTask[id][fl] = struct{}{}
	f.mu.Unlock()
	return ctx, fl.fired.Load, func() {
		f.mu.Lock()
		delete(f.byTask[id], fl)
		if len(f.byTask[id]) == 0 {
			delete(f.byTask, id)
		}
		f.mu.Unlock()
		cancel()
	}
}

// end cancels the attempts of task id running here; it reports how many.
func (f *flights) end(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for fl := range f.byTask[id] {
		fl.fired.Store(true)
		fl.cancel()
	}
	return len(f.byTask[id])
}

// listenForCancels subscribes to the review actions and ends the attempts
// of every task a human cancels.
func (s *Service) listenForCancels(nc *nats.Conn) error {
	sub, err := nc.Subscribe(events.ReviewSubject(events.ReviewAction, "*"), func(m *nats.Msg) {
		var a events.Action
		if json.Unmarshal(m.Data, &a) != nil || a.Action != events.ActionCancel || !events.ValidID(a.TaskID) {
			return
		}
		if n := s.flights.end(a.TaskID); n > 0 {
			s.cfg.Log.Info("task cancelled by a human: its call is abandoned", "task", a.TaskID, "by", a.By)
		}
	})
	if err != nil {
		return fmt.Errorf("executor: subscribe to cancels: %w", err)
	}
	s.flights.mu.Lock()
	s.flights.sub = sub
	s.flights.mu.Unlock()
	return nil
}

// abandonTimeout bounds the write that keeps what an attempt a cancel cut
// short spent.
const abandonTimeout = 15 * time.Second

// abandon keeps what an attempt that a cancel cut short spent, and returns
// the task's state. The attempt's calls may have been answered before the
// cancel was heard — all of them, the Result built and the attempt settled
// — and the Result is dropped: its spend (the earlier tries' and this
// try's, a.f.unbilled + a.tried) becomes the attempt's unbilled spend, as
// for a try that a transient failure cuts short (task.Abandon). A call
// still in flight had reported nothing, and adds nothing. It writes past
// ctx's end, briefly.
func (s *Service) abandon(ctx context.Context, a *attempt) (events.TaskState, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	spent := a.f.unbilled.Add(a.tried)
	st, _, err := s.cfg.Tasks.Apply(ctx, a.base.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.Abandon(st, found, a.base, spent)
	})
	return st, err
}
