package trust

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
)

// View is every task type's trust as the services that score types see it:
// each type's window, read from the outcome stream (OutcomeStream), and its
// gate facts — block streak, remembered gate decisions, canary places —
// from the trust bucket, both followed as they change, in memory. Scoring a
// type reads nothing from the server, and no outcome is a write of a shared
// value: a recorder publishes it, every View receives it.
//
// A View lags the stream by the time the server takes to deliver a message
// (well under a millisecond on a healthy server); decisions that change the
// gate facts are compare-and-set on the bucket (Store), never on the View.
type View struct {
	// SyncWait bounds how long Sync waits for the View to receive an
	// outcome the stream holds. Default DefaultSyncWait; set it before the
	// View is used.
	SyncWait time.Duration

	log    *slog.Logger
	stream jetstream.Stream

	mu      sync.RWMutex
	windows map[string]*window // by type
	facts   map[string]Stats   // by type: the bucket's value, Outcomes nil
	applied chan struct{}      // closed (and replaced) whenever an outcome is applied
	version uint64             // counts the outcomes applied

	poolMu      sync.Mutex
	pool        *Pool
	poolVersion uint64
	poolAt      time.Time
	poolWindow  int

	stop func()            // ends following
	done []<-chan struct{} // each closed when a follower has stopped applying
}

// PoolEvery is how often, at most, the View measures the pool again while
// outcomes come in: a prior a fraction of a second old is as good as a
// fresh one, and measuring reads every type's window.
const PoolEvery = 25 * time.Millisecond

// Pool is the mesh's pooled evidence (NewPool) under p, measured again when
// outcomes were applied since, at most every PoolEvery.
func (v *View) Pool(p Policy) *Pool {
	v.mu.RLock()
	version := v.version
	v.mu.RUnlock()
	window := p.WithDefaults().Window
	v.poolMu.Lock()
	defer v.poolMu.Unlock()
	if v.pool != nil && v.poolWindow == window && (v.poolVersion == version || time.Since(v.poolAt) < PoolEvery) {
		return v.pool
	}
	v.pool, v.poolVersion, v.poolAt, v.poolWindow = NewPool(v.All(), p), version, time.Now(), window
	return v.pool
}

// Applied returns a channel closed when the View next applies an outcome,
// of any type.
func (v *View) Applied() <-chan struct{} {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.applied
}

// DefaultSyncWait is how long Sync waits, by default, for an outcome the
// stream holds to reach the View: far longer than a healthy server takes,
// short enough that a View that stopped following is an error the caller
// retries, not a handler waiting for ever.
const DefaultSyncWait = 10 * time.Second

// NewView reads every type's outcomes and gate facts and follows them until
// Stop is called. It returns once what the stream and the bucket held when
// it started has been read, or when ctx ends first. facts may be nil: the
// View then holds windows only.
func NewView(ctx context.Context, js jetstream.JetStream, facts jetstream.KeyValue, log *slog.Logger) (*View, error) {
	if log == nil {
		log = slog.Default()
	}
	v := &View{SyncWait: DefaultSyncWait, log: log.With("stream", OutcomeStream), windows: map[string]*window{}, facts: map[string]Stats{}, applied: make(chan struct{})}
	stream, err := js.Stream(ctx, OutcomeStream)
	if err != nil {
		return nil, fmt.Errorf("trust: outcome stream %s: %w", OutcomeStream, err)
	}
	v.stream = stream
	// Both are followed through consumers only this View can feed
	// (internal/runtime/follow): a message another consumer delivers into their
	// inboxes — any user who may create a consumer can aim one there — is
	// logged and dropped.
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	caught := make(chan struct{})
	outcomes, err := follow.Stream(fctx, js, follow.Config{
		Stream: OutcomeStream, Filters: []string{OutcomeFilter}, Log: log,
		CaughtUp: func() { close(caught) },
	}, func(m follow.Msg) { v.apply(m.Subject, m.Data, m.Seq) })
	if err != nil {
		cancel()
		return nil, fmt.Errorf("trust: follow %s: %w", OutcomeStream, err)
	}
	v.stop, v.done = cancel, []<-chan struct{}{outcomes.Done()}
	if facts != nil {
		w, err := follow.WatchAll(fctx, js, facts, follow.WatchOptions{Log: log})
		if err != nil {
			cancel()
			return nil, fmt.Errorf("trust: watch %s: %w", facts.Bucket(), err)
		}
		initial, factsDone := make(chan struct{}), make(chan struct{})
		v.done = append(v.done, factsDone)
		go func() {
			defer close(factsDone)
			v.followFacts(w, initial)
		}()
		select {
		case <-initial:
		case <-ctx.Done():
			v.Stop()
			return nil, ctx.Err()
		}
	}
	select {
	case <-caught:
	case <-ctx.Done():
		v.Stop()
		return nil, ctx.Err()
	}
	return v, nil
}

// Stop stops following the stream and the bucket. It returns once the
// View has stopped changing: no outcome or gate fact is applied after it,
// so a Sync that needs a later outcome fails.
func (v *View) Stop() {
	v.stop()
	for _, done := range v.done {
		<-done
	}
}

func (v *View) followFacts(w jetstream.KeyWatcher, initial chan struct{}) {
	closed := false
	for e := range w.Updates() {
		if e == nil {
			if !closed {
				close(initial)
				closed = true
			}
			continue
		}
		v.mu.Lock()
		if e.Operation() != jetstream.KeyValuePut {
			delete(v.facts, e.Key())
		} else if st, err := decode(e.Key(), e.Value()); err != nil {
			v.log.Warn("gate facts that do not decode are ignored", "type", e.Key(), "err", err)
		} else {
			st.Outcomes = nil
			v.facts[e.Key()] = st
		}
		v.mu.Unlock()
	}
	if !closed {
		close(initial)
	}
}

// apply adds one outcome message, stored at seq. A message that does not
// decode cannot have been published by a recorder: it is logged and left
// out. One at or below the sequence of the newest applied for its type
// was applied already (the stream is followed in order): it is left out.
func (v *View) apply(subject string, data []byte, seq uint64) {
	taskType, ok := strings.CutPrefix(subject, OutcomeRoot+".")
	if !ok {
		return
	}
	o, err := DecodeOutcome(data)
	v.mu.Lock()
	defer v.mu.Unlock()
	w := v.windows[taskType]
	if w == nil {
		w = &window{keys: map[string]struct{}{}}
		v.windows[taskType] = w
	}
	if seq <= w.seq {
		return
	}
	w.seq = seq
	v.version++
	close(v.applied)
	v.applied = make(chan struct{})
	if err != nil {
		v.log.Warn("outcome message left out of the window", "subject", subject, "err", err)
		return
	}
	w.insert(o, Keep)
}

// Sync returns once the View holds every outcome of taskType the stream
// held when Sync was called — one direct get of the type's newest outcome,
// then a wait for the View to apply it (usually none). A pass whose task's
// own previous outcome must count — a retry — syncs first: that outcome
// was stored before the retry was published, and the View may not have
// received it yet. A View that does not receive it within SyncWait (it
// stopped following the stream) makes Sync return an error.
func (v *View) Sync(ctx context.Context, taskType string) error {
	raw, err := v.stream.GetLastMsgForSubject(ctx, OutcomeSubject(taskType))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("trust: newest outcome of %s: %w", taskType, err)
	}
	var timeout <-chan time.Time
	for {
		v.mu.RLock()
		w, applied := v.windows[taskType], v.applied
		done := w != nil && w.seq >= raw.Sequence
		v.mu.RUnlock()
		if done {
			return nil
		}
		if timeout == nil {
			t := time.NewTimer(v.SyncWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-applied:
		case <-timeout:
			return fmt.Errorf("trust: outcome %d of %s not received in %s: the View is not following %s", raw.Sequence, taskType, v.SyncWait, OutcomeStream)
		case <-ctx.Done():
			return fmt.Errorf("trust: outcomes of %s up to %d: %w", taskType, raw.Sequence, ctx.Err())
		}
	}
}

// window is one type's outcomes as a View keeps them: what Insert keeps,
// with the keys indexed. Readers hold its slice without a lock, so the
// elements a slice shows are never changed in place: the newest outcome —
// the usual case — is appended (past every slice handed out) and the
// oldest dropped by reslicing; one arriving out of order is inserted into
// a copy.
type window struct {
	outcomes []Outcome
	fold     *scoring.Fold // of outcomes: folded once for every reader
	keys     map[string]struct{}
	seq      uint64 // the stream sequence of the newest message applied
}

func (w *window) insert(o Outcome, limit int) {
	if _, dup := w.keys[o.Key]; dup {
		return
	}
	n := len(w.outcomes)
	switch {
	case n == 0 || !scoring.OutcomeAfter(w.outcomes[n-1], o):
		w.outcomes = append(w.outcomes, o)
	case n >= limit && !scoring.OutcomeAfter(o, w.outcomes[0]):
		return // older than everything a full window keeps
	default:
		w.outcomes, _ = Insert(w.outcomes, o, n+1) // a copy: slices handed out stay as they were
	}
	w.keys[o.Key] = struct{}{}
	for len(w.outcomes) > limit {
		delete(w.keys, w.outcomes[0].Key)
		w.outcomes = w.outcomes[1:]
	}
	w.fold = scoring.NewFold(w.outcomes)
}

// Stats is taskType's trust: its outcomes, oldest first (the newest Keep;
// Score and Evaluate take the policy's window of them), and its gate facts.
// The slices are shared and must not be modified.
func (v *View) Stats(taskType string) Stats {
	v.mu.RLock()
	defer v.mu.RUnlock()
	st := v.facts[taskType]
	st.Type = taskType
	if w := v.windows[taskType]; w != nil {
		st.Outcomes = w.outcomes[:len(w.outcomes):len(w.outcomes)] // appends by the caller copy
		st.Fold = w.fold
	}
	return st
}

// All is every type's Stats (a type with outcomes or gate facts), sorted by type.
func (v *View) All() []Stats {
	v.mu.RLock()
	types := make([]string, 0, len(v.windows)+len(v.facts))
	for t := range v.windows {
		types = append(types, t)
	}
	for t := range v.facts {
		if _, ok := v.windows[t]; !ok {
			types = append(types, t)
		}
	}
	v.mu.RUnlock()
	slices.Sort(types)
	all := make([]Stats, len(types))
	for i, t := range types {
		all[i] = v.Stats(t)
	}
	return all
}
