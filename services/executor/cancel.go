package executor

import (
	"context"
	"encoding/json"
	"sync/atomic"

	"dispatchmesh/events"
)

// watchEnd returns a context derived from ctx that ends as soon as the
// task's state shows a terminal status (a human cancelled the task while
// the model works on it), ended, which reports whether that happened, and
// stop, which releases the watch.
//
// The watch is a KV watch of the task's key (one ordered consumer for the
// length of one attempt): its first update is the current state, so a
// cancel stored between the ledger's begin and the watch is seen too.
// Without a task store (tests, the in-memory ledger) nothing is watched.
func (s *Service) watchEnd(ctx context.Context, id string) (context.Context, func() bool, func()) {
	var fired atomic.Bool
	ended := func() bool { return fired.Load() }
	if s.cfg.Tasks == nil {
		return ctx, ended, func() {}
	}
	cctx, cancel := context.WithCancel(ctx)
	w, err := s.cfg.Tasks.Watch(cctx, id)
	if err != nil {
		// The attempt goes on; the recorder still ignores an outcome
		// that arrives after the task ended.
		s.cfg.Log.Warn("cannot watch the task for a cancel", "task", id, "err", err)
		return cctx, ended, cancel
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-cctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue // the end of the current value
				}
				var st events.TaskState
				if json.Unmarshal(e.Value(), &st) == nil && events.Terminal(st.Status) {
					fired.Store(true)
					cancel()
					return
				}
			}
		}
	}()
	return cctx, ended, func() {
		cancel()
		<-done
		_ = w.Stop()
	}
}
