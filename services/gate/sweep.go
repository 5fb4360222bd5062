package gate

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Rewake is how long the sweeper leaves a pass it woke before it wakes it
// again (its look may not have run yet, or left it asleep), doubling with
// every wake of the same pass up to MaxRewake: a pass whose looks keep
// leaving it asleep (trial places all taken while its type is on
// probation, a look that judges the type below where the sweeper's view
// did not yet) costs a wake every few minutes, not every few seconds. Two
// sweepers — two gate instances — that wake a pass within the same Rewake
// period publish the same Nats-Msg-Id: the stream keeps one wake.
const (
	Rewake    = 5 * time.Second
	MaxRewake = 5 * time.Minute
)

// woken is when a sweeper last woke a pass, and how many times it has.
type woken struct {
	at time.Time
	n  int
}

// due reports whether a pass woken as w may be woken again at now.
func (w woken) due(now time.Time) bool {
	after := Rewake
	for i := 1; i < w.n && after < MaxRewake; i++ {
		after *= 2
	}
	return now.Sub(w.at) >= min(after, MaxRewake)
}

// MaxWakesPerSweep bounds the wakes one sweep publishes, so that a sweep
// of a large index ends quickly; the next sweep goes on.
const MaxWakesPerSweep = 1000

// Why a sweep wakes a held pass (the "why" label of dispatch_gate_wakes_total).
const (
	WakeReadmit = "readmit" // its type recovered (or is exempt now): oldest first, Config.Readmit per sweep
	WakeProbe   = "probe"   // a probe of its type is due: the oldest, once per probe interval
	WakeExpired = "expired" // held for its hold time: its look hands it to a human
)

// Sweep wakes the passes asleep in the held index until ctx ends: every
// Config.SweepEvery it looks at each type with held passes, in memory (a
// watch of the index, the gate's view of the type's trust), and wakes —
// republishes as dispatch.task.<id>.wake the held event the entry names —
// the passes whose look may now end their hold: every pass held past its
// hold time; while the type is below its threshold, the oldest one when
// a probe of the type is due; once it recovered, the oldest Config.Readmit
// (the look admits them, a few at a time while the type is on probation).
// A woken pass's look decides as any look does, and either ends the hold
// (its entry goes) or leaves it asleep. A sweep reads nothing from the
// server but the events it republishes, so the gate's cost of a held pass
// is one entry, not a look every few seconds.
func (s *Service) Sweep(ctx context.Context) {
	for ctx.Err() == nil {
		err := s.sweepIndex(ctx)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("held index sweeper stopped; restarting", "err", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

// heldIndex is the sweeper's copy of the held index: entries by key, and
// each type's keys in order (oldest first).
type heldIndex struct {
	mu      sync.Mutex
	entries map[string]services.HeldEntry
	byType  map[string][]string
}

// apply takes one update of the watch into x; an entry that cannot be read
// is logged and left out.
func (x *heldIndex) apply(e jetstream.KeyValueEntry, log *slog.Logger) {
	x.mu.Lock()
	defer x.mu.Unlock()
	key := e.Key()
	typ, _, _, _, ok := services.ParseHeldKey(key)
	if !ok {
		return // not an entry of the index: left alone
	}
	keys := x.byType[typ]
	i, found := slices.BinarySearch(keys, key)
	if e.Operation() != jetstream.KeyValuePut {
		if found {
			x.byType[typ] = slices.Delete(keys, i, i+1)
			if len(x.byType[typ]) == 0 {
				delete(x.byType, typ)
			}
		}
		delete(x.entries, key)
		return
	}
	entry, err := services.DecodeHeldEntry(key, e.Value())
	if err != nil {
		log.Error("held index entry unreadable: left alone", "key", key, "err", err)
		return
	}
	x.entries[key] = entry
	if !found {
		x.byType[typ] = slices.Insert(keys, i, key)
	}
}

// Asleep is how many passes of each type sleep in the held index, as the
// sweeper's watch last saw it (nil before the sweeper started).
func (s *Service) Asleep() map[string]int {
	x := s.index.Load()
	if x == nil {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	counts := make(map[string]int, len(x.byType))
	for typ, keys := range x.byType {
		counts[typ] = len(keys)
	}
	return counts
}

// sweepIndex watches the index and sweeps it every SweepEvery until ctx
// ends or the watch fails.
func (s *Service) sweepIndex(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := follow.WatchAll(wctx, s.cfg.JS, s.cfg.Held.KV(), follow.WatchOptions{Log: s.log})
	if err != nil {
		return err
	}
	defer w.Stop()
	stream, err := s.stream(ctx)
	if err != nil {
		return err
	}
	x := &heldIndex{entries: map[string]services.HeldEntry{}, byType: map[string][]string{}}
	woke := map[string]woken{}
	ticker := time.NewTicker(s.cfg.SweepEvery)
	defer ticker.Stop()
	current := false // the watch delivered every entry there was
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errWatchStopped
			}
			if e == nil {
				current = true
				s.index.Store(x)
				continue
			}
			x.apply(e, s.log)
		case <-ticker.C:
			if !current {
				continue
			}
			// Every update the watch holds first: a sweep slower than a
			// tick must not leave the copy behind the index.
			if err := drain(w.Updates(), x, s.log); err != nil {
				return err
			}
			s.sweep(ctx, stream, x, woke)
		}
	}
}

// errWatchStopped ends a sweeper whose watch of the held index stopped
// (Sweep starts it again).
var errWatchStopped = errors.New("the watch of the held index stopped")

// drain applies to x every update already waiting on updates.
func drain(updates <-chan jetstream.KeyValueEntry, x *heldIndex, log *slog.Logger) error {
	for {
		select {
		case e, ok := <-updates:
			if !ok {
				return errWatchStopped
			}
			if e != nil {
				x.apply(e, log)
			}
		default:
			return nil
		}
	}
}

// wake is one pass a sweep wakes, and why.
type wake struct {
	entry services.HeldEntry
	why   string
}

// sweep wakes what is due in x; woke holds when this sweeper last woke
// each key still in the index. Types take turns at the head of the sweep
// (the start rotates), so MaxWakesPerSweep favours none.
func (s *Service) sweep(ctx context.Context, stream jetstream.Stream, x *heldIndex, woke map[string]woken) {
	now := s.cfg.Now().UTC()
	var due []wake
	x.mu.Lock()
	for key := range woke {
		if _, ok := x.entries[key]; !ok {
			delete(woke, key) // its hold ended
		}
	}
	types := make([]string, 0, len(x.byType))
	for typ := range x.byType {
		types = append(types, typ)
	}
	slices.Sort(types)
	if len(types) > 0 {
		s.turn = (s.turn + 1) % len(types)
		types = append(types[s.turn:], types[:s.turn]...)
	}
	for _, typ := range types {
		due = append(due, s.dueOf(typ, x.byType[typ], x.entries, now, woke, MaxWakesPerSweep-len(due))...)
		if len(due) >= MaxWakesPerSweep {
			break
		}
	}
	x.mu.Unlock()
	// Published together, then their acks awaited: a sweep of a thousand
	// wakes takes a few round trips, not a thousand.
	type sent struct {
		w   wake
		ack jetstream.PubAckFuture
	}
	var pending []sent
	for _, w := range due {
		ack, err := s.wake(ctx, stream, w, now)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("waking a held pass failed; the next sweep tries again", "task", w.entry.Task, "type", w.entry.Type, "err", err)
			}
			continue
		}
		woke[w.entry.Key()] = woken{at: now, n: woke[w.entry.Key()].n + 1}
		if ack != nil {
			pending = append(pending, sent{w, ack})
		}
	}
	for _, p := range pending {
		select {
		case a := <-p.ack.Ok():
			if !a.Duplicate { // another sweeper's wake of this period was stored first
				s.metrics.wakes.WithLabelValues(s.metrics.types.Label(p.w.entry.Type), p.w.why).Inc()
			}
		case err := <-p.ack.Err():
			s.log.Warn("waking a held pass failed; it is woken again later", "task", p.w.entry.Task, "type", p.w.entry.Type, "err", err)
		case <-ctx.Done():
			return
		}
	}
}

// dueOf is what a sweep wakes of one type's held passes, keys oldest
// first, at most limit: each held past the hold time; once the type
// recovered — for a retry, judged on its settled tasks — the oldest
// Readmit, expired ones among them, and while it is on probation no more
// than its free trial places; while it is below, the oldest one when a
// probe is due. A pass woken lately (woken.due) is left to its look.
func (s *Service) dueOf(typ string, keys []string, entries map[string]services.HeldEntry, now time.Time, woke map[string]woken, limit int) []wake {
	pol := s.cfg.Policy.Snapshot().For(typ)
	scoring := pol.Scoring(s.cfg.Scoring).WithDefaults()
	stats := s.cfg.View.Stats(typ)
	prior := scoring.PriorOf(s.pool(), typ)
	first, retry := scoring.EvaluateWith(typ, stats, prior, false), scoring.EvaluateWith(typ, stats, prior, true)
	exempt := pol.IsExempt() || scoring.Threshold < 0
	_, probe := scoring.HeldProbe(stats, now)
	probe = probe && !exempt && (first.Below || retry.Below)
	readmits := s.cfg.Readmit
	if first.Probation { // the look admits no more than the free trial places
		readmits = min(readmits, max(0, scoring.TrialPlaces(stats)-task.LiveHolders(stats, scoring, now, "")))
	}
	var due []wake
	for _, key := range keys {
		if len(due) >= limit {
			break
		}
		e := entries[key]
		expired := now.Sub(e.Since) >= scoring.HoldTime
		if !expired && readmits <= 0 && !probe {
			break // nothing younger can be due
		}
		if w, ok := woke[key]; ok && !w.due(now) {
			continue
		}
		open := exempt || !first.Below
		if e.Retry {
			open = exempt || !retry.Below
		}
		switch {
		case open && readmits > 0:
			due = append(due, wake{e, WakeReadmit})
			readmits--
		case open:
			// Re-admitted in turn, even past its hold time: its look
			// admits it, or hands it to a human.
		case expired:
			due = append(due, wake{e, WakeExpired})
		case probe:
			due = append(due, wake{e, WakeProbe})
			probe = false
		}
	}
	return due
}

// wake republishes the held event entry w names as a wake of its pass,
// for the held consumer to look at; ack is nil when there was nothing to
// publish.
func (s *Service) wake(ctx context.Context, stream jetstream.Stream, w wake, now time.Time) (ack jetstream.PubAckFuture, err error) {
	e := w.entry
	raw, err := stream.GetMsg(ctx, e.Seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// The stream no longer holds it (older than its MaxAge): nothing
		// can wake the pass. Its entry goes; the task stays held, found by
		// `dispatch ls -status held` and the explorer.
		s.log.Error("held pass cannot be woken: its held event left the stream; its entry is removed, the task stays held",
			"task", e.Task, "type", e.Type, "pass", e.Pass, "seq", e.Seq)
		return nil, s.cfg.Held.Delete(ctx, e.Key())
	}
	if err != nil {
		return nil, err
	}
	id, stage, ok := events.ParseTaskSubject(raw.Subject)
	if !ok || id != e.Task || (stage != events.StageHeld && stage != events.StageWake) || raw.Header.Get(events.HeaderPass) != strconv.Itoa(e.Pass) {
		s.log.Error("held index entry names another message: removed", "key", e.Key(), "seq", e.Seq, "subject", raw.Subject)
		return nil, s.cfg.Held.Delete(ctx, e.Key())
	}
	msg := nats.NewMsg(events.TaskSubject(e.Task, events.StageWake))
	for k, vs := range raw.Header {
		if !strings.HasPrefix(k, "Nats-") {
			msg.Header[k] = vs
		}
	}
	msg.Header.Set(events.HeaderService, s.cfg.Instance)
	msg.Data = raw.Data
	period := now.Truncate(Rewake).Unix()
	return s.cfg.JS.PublishMsgAsync(msg, jetstream.WithMsgID(services.MsgID(e.Task, e.Pass, "wake-"+strconv.FormatInt(period, 10))))
}
