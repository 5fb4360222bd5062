package executor

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/services"
)

// watchEnd returns a context derived from ctx that ends as soon as the
// task's state shows a terminal status (a human cancelled the task while
// the model works on it), ended, which reports whether that happened, and
// stop, which releases the watch.
//
// Every attempt in flight is watched through one KV watch of the whole
// task bucket (ends), started with the first attempt and kept until Close:
// an attempt in flight costs an entry in a map, not a consumer on the
// server. The watch delivers every change stored after it started; call
// watchEnd before reading the task's state (the ledger's begin), so a
// cancel stored after that read is seen, and one stored before it is seen
// by the read. Without a task store (tests, the in-memory ledger) nothing
// is watched.
func (s *Service) watchEnd(ctx context.Context, id string) (context.Context, func() bool, func()) {
	var fired atomic.Bool
	ended := func() bool { return fired.Load() }
	if s.cfg.Tasks == nil {
		return ctx, ended, func() {}
	}
	cctx, cancel := context.WithCancel(ctx)
	w := &endWatch{fired: &fired, cancel: cancel}
	if err := s.ends.add(id, w); err != nil {
		// The attempt goes on; the recorder still ignores an outcome
		// that arrives after the task ended.
		s.cfg.Log.Warn("cannot watch the task for a cancel", "task", id, "err", err)
		return cctx, ended, cancel
	}
	return cctx, ended, func() {
		s.ends.remove(id, w)
		cancel()
	}
}

// endWatch is one attempt waiting to hear that its task ended.
type endWatch struct {
	fired  *atomic.Bool
	cancel context.CancelFunc
}

// ends is the one watch of the task bucket an executor keeps for its
// attempts in flight. It sees every task's changes (a few per task, the
// executor's own among them) and decodes only those of tasks in flight.
type ends struct {
	tasks *services.TaskStore
	mu    sync.Mutex
	// watching holds the attempts in flight by task id (a redelivery may
	// run beside the first delivery: handlers are idempotent).
	watching map[string]map[*endWatch]struct{}
	// cur is the running watch; nil when none runs.
	cur *bucketWatch
	// failedAt is when starting the watch last failed: it is tried again
	// at most every endsRetryAfter, not for every attempt.
	failedAt time.Time
	err      error
	closed   bool
}

// bucketWatch is one run of the watch.
type bucketWatch struct {
	kw   jetstream.KeyWatcher
	stop context.CancelFunc
}

const endsRetryAfter = 10 * time.Second

var errEndsClosed = errors.New("the executor is closed")

// add registers w for task id, starting the watch if none runs.
func (e *ends) add(id string, w *endWatch) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur == nil {
		if err := e.startLocked(); err != nil {
			return err
		}
	}
	if e.watching == nil {
		e.watching = map[string]map[*endWatch]struct{}{}
	}
	set := e.watching[id]
	if set == nil {
		set = map[*endWatch]struct{}{}
		e.watching[id] = set
	}
	set[w] = struct{}{}
	return nil
}

func (e *ends) remove(id string, w *endWatch) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.watching[id], w)
	if len(e.watching[id]) == 0 {
		delete(e.watching, id)
	}
}

// startLocked starts the watch: it returns once the server delivers every
// change stored from now on.
func (e *ends) startLocked() error {
	switch {
	case e.closed:
		return errEndsClosed
	case !e.failedAt.IsZero() && time.Since(e.failedAt) < endsRetryAfter:
		return e.err
	}
	ctx, stop := context.WithCancel(context.Background())
	kw, err := e.tasks.WatchAll(ctx)
	if err != nil {
		stop()
		e.failedAt, e.err = time.Now(), err
		return err
	}
	e.failedAt, e.err = time.Time{}, nil
	e.cur = &bucketWatch{kw: kw, stop: stop}
	go e.run(ctx, e.cur)
	return nil
}

// run fires the attempts of every task whose state turns terminal, until
// the watch ends: at close, or when its connection is gone (the next
// attempt then starts a new one; those registered with this one go on
// unwatched, as when the watch cannot start).
func (e *ends) run(ctx context.Context, w *bucketWatch) {
	defer func() {
		_ = w.kw.Stop()
		w.stop()
		e.mu.Lock()
		if e.cur == w {
			e.cur = nil
		}
		e.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case en, ok := <-w.kw.Updates():
			if !ok {
				return
			}
			if en == nil || en.Operation() != jetstream.KeyValuePut {
				continue
			}
			e.fire(en)
		}
	}
}

// fire ends the attempts of en's task if en shows it ended.
func (e *ends) fire(en jetstream.KeyValueEntry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	set := e.watching[en.Key()]
	if len(set) == 0 {
		return
	}
	var st struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(en.Value(), &st) != nil || !events.Terminal(st.Status) {
		return
	}
	for w := range set {
		w.fired.Store(true)
		w.cancel()
	}
}

// close stops the watch; no attempt is watched after it.
func (e *ends) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	if e.cur != nil {
		e.cur.stop()
	}
}
