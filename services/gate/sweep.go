package gate

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"math"
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

// woken is when a sweeper last woke a pass, and how many times it has;
// place, whether for a canary place while its type was still unproven;
// rung, the rung a retry waited to climb onto (events.HoldRung), and
// measured, whether that rung had been measured.
type woken struct {
	at       time.Time
	n        int
	place    bool
	rung     events.Rung
	measured bool
	tries    int // the retries measured on rung when it was woken
}

// due reports whether a pass woken as w may be woken again at now; round,
// whether its type still sends canaries. A pass woken for a canary place
// that its look found taken may go as soon as the canaries score its
// type: it is due at once when round is over.
func (w woken) due(now time.Time, round bool) bool {
	if w.place && !round {
		return true
	}
	after := Rewake
	for i := 1; i < w.n && after < MaxRewake; i++ {
		after *= 2
	}
	return now.Sub(w.at) >= min(after, MaxRewake)
}

// MaxWakesPerSweep bounds the wakes one sweep publishes, so that a sweep
// of a large index ends quickly; the next sweep goes on.
const MaxWakesPerSweep = 1000

// SweepAgain is how soon the sweeper sweeps again after a sweep the
// model's backlog (Config.MaxBacklog) or MaxWakesPerSweep cut short, at
// most Config.SweepEvery.
const SweepAgain = 25 * time.Millisecond

// Why a sweep wakes a held pass (the "why" label of dispatch_gate_wakes_total).
const (
	WakeReadmit = "readmit" // its type recovered (or is exempt now): oldest first, Config.Readmit per sweep
	WakeProbe   = "probe"   // a probe of its type is due: the oldest, once per probe interval
	WakeExpired = "expired" // held for its hold time: its look hands it to a human
	WakeCanary  = "canary"  // waiting for canaries: a place is free, the type is scored, or it waited the canary TTL
	WakeQueued  = "queued"  // waiting its turn: the queue before the model has room
	WakeRung    = "rung"    // a retry waiting to climb a rung: a place on it is free, it is measured, or it waited the canary TTL
)

// Sweep wakes the passes asleep in the held index until ctx ends: every
// Config.SweepEvery it looks at each type with held passes, in memory (a
// watch of the index, the gate's view of the type's trust), and wakes —
// republishes as dispatch.task.<id>.wake the held event the entry names —
// the passes whose look may now end their hold: every pass held past its
// hold time; while the type is below its threshold, the oldest one when
// a probe of the type is due; once it recovered, the oldest Config.Readmit
// (the look admits them, a few at a time while the type is on probation);
// of the passes waiting for the type's canaries, as many of the oldest as
// there are free places, every one once the canaries scored the type, and
// each that waited the canary TTL; of the retries waiting for the first
// retries onto their rung, as many as the rung has free places, every one
// once the rung is measured, and each that waited the canary TTL (dueOf).
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
// each lane's keys in order (oldest first).
type heldIndex struct {
	mu      sync.Mutex
	entries map[string]services.HeldEntry
	lanes   map[lane][]string
}

// lane is the passes of one type held for one thing: its trust, its
// canaries, or their turn. Each lane is swept oldest first on its own.
type lane struct {
	typ  string
	hold events.Hold
}

func laneOf(e services.HeldEntry) lane {
	if e.Hold == "" {
		return lane{e.Type, events.HoldTrust}
	}
	return lane{e.Type, e.Hold}
}

// apply takes one update of the watch into x; an entry that cannot be read
// is logged and left out.
func (x *heldIndex) apply(e jetstream.KeyValueEntry, log *slog.Logger) {
	x.mu.Lock()
	defer x.mu.Unlock()
	key := e.Key()
	if _, _, _, _, ok := services.ParseHeldKey(key); !ok {
		return // not an entry of the index: left alone
	}
	if old, ok := x.entries[key]; ok { // a removal, or an entry written anew
		x.remove(laneOf(old), key)
		delete(x.entries, key)
	}
	if e.Operation() != jetstream.KeyValuePut {
		return
	}
	entry, err := services.DecodeHeldEntry(key, e.Value())
	if err != nil {
		log.Error("held index entry unreadable: left alone", "key", key, "err", err)
		return
	}
	x.entries[key] = entry
	l := laneOf(entry)
	keys := x.lanes[l]
	i, _ := slices.BinarySearch(keys, key)
	x.lanes[l] = slices.Insert(keys, i, key)
}

// remove takes key out of lane l.
func (x *heldIndex) remove(l lane, key string) {
	keys := x.lanes[l]
	if i, found := slices.BinarySearch(keys, key); found {
		x.lanes[l] = slices.Delete(keys, i, i+1)
	}
	if len(x.lanes[l]) == 0 {
		delete(x.lanes, l)
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
	counts := make(map[string]int, len(x.lanes))
	for l, keys := range x.lanes {
		counts[l.typ] += len(keys)
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
	x := &heldIndex{entries: map[string]services.HeldEntry{}, lanes: map[lane][]string{}}
	woke := map[string]woken{}
	s.checked = map[lane]time.Time{}
	ticker := time.NewTicker(s.cfg.SweepEvery)
	defer ticker.Stop()
	// A sweep the model's backlog cut short sweeps again soon: the bound
	// paces bulk wakes to the rate the backlog drains, not to one
	// MaxBacklog per SweepEvery. So does an outcome while passes wait for
	// canaries: it may be the one that scores their type.
	again := time.NewTimer(time.Hour)
	again.Stop()
	defer again.Stop()
	soon := false    // again is set
	current := false // the watch delivered every entry there was
	// Taken before each sweep reads the view: an outcome applied during
	// the sweep finds it closed.
	applied := s.cfg.View.Applied()
	var marks map[string]string // what the last sweep saw of the types with passes waiting for canaries
	for {
		var outcome <-chan struct{}
		if current && !soon && (marks != nil || x.waiting()) {
			outcome = applied
		}
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
			continue
		case <-outcome:
			applied = s.cfg.View.Applied()
			if maps.Equal(marks, s.canaryMarks(x)) {
				continue // an outcome of a type no pass waits for
			}
			again.Reset(min(s.cfg.SweepEvery, SweepAgain))
			soon = true
			continue
		case <-ticker.C:
		case <-again.C:
			soon = false
		}
		if !current {
			continue
		}
		// Every update the watch holds first: a sweep slower than a tick
		// must not leave the copy behind the index.
		if err := drain(w.Updates(), x, s.log); err != nil {
			return err
		}
		applied, marks = s.cfg.View.Applied(), s.canaryMarks(x)
		if s.sweep(ctx, stream, x, woke) && !soon {
			again.Reset(min(s.cfg.SweepEvery, SweepAgain))
			soon = true
		}
	}
}

// waiting reports whether any pass in x waits for its type's canaries or
// a rung's (without canaryTypes' list: it is asked at every update of
// the watch).
func (x *heldIndex) waiting() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for l := range x.lanes {
		if l.hold.ForOutcomes() {
			return true
		}
	}
	return false
}

// canaryTypes lists the types with passes in x waiting for their
// canaries or a rung's.
func (x *heldIndex) canaryTypes() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var types []string
	for l := range x.lanes {
		if l.hold.ForOutcomes() && !slices.Contains(types, l.typ) {
			types = append(types, l.typ)
		}
	}
	return types
}

// canaryMarks is, for each type with passes in x waiting for its
// canaries or a rung's, its newest outcome as the view holds it (nil when
// none waits): an outcome that changes one may be the one that scores it,
// or measures the rung.
func (s *Service) canaryMarks(x *heldIndex) map[string]string {
	types := x.canaryTypes()
	if len(types) == 0 {
		return nil
	}
	marks := make(map[string]string, len(types))
	for _, typ := range types {
		mark := ""
		if outs := s.cfg.View.Stats(typ).Outcomes; len(outs) > 0 {
			mark = strconv.Itoa(len(outs)) + " " + outs[len(outs)-1].Key
		}
		marks[typ] = mark
	}
	return marks
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

// wake is one pass a sweep wakes, and why; place, whether for a free
// canary place (its look may find it taken and leave it asleep); for a
// retry waiting for a rung, measured, whether its rung has been measured
// (a wake of its own, not one a place wake of the same period stands for).
type wake struct {
	entry    services.HeldEntry
	why      string
	place    bool
	measured bool
	tries    int // for a retry waiting for a rung: the retries measured on it
}

// sweep wakes what is due in x; woke holds when this sweeper last woke
// each key still in the index. Lanes take turns at the head of the sweep
// (the start rotates), so MaxWakesPerSweep favours none.
//
// It reports whether it may have left passes due for want of room (the
// backlog before the model was full, or MaxWakesPerSweep reached): the
// sweeper then sweeps again after SweepAgain.
func (s *Service) sweep(ctx context.Context, stream jetstream.Stream, x *heldIndex, woke map[string]woken) (more bool) {
	now := s.cfg.Now().UTC()
	var due []wake
	x.mu.Lock()
	for key := range woke {
		if _, ok := x.entries[key]; !ok {
			delete(woke, key) // its hold ended
		}
	}
	lanes := slices.SortedFunc(maps.Keys(x.lanes), func(a, b lane) int {
		return cmp.Or(strings.Compare(a.typ, b.typ), strings.Compare(string(a.hold), string(b.hold)))
	})
	if len(lanes) > 0 {
		s.turn = (s.turn + 1) % len(lanes)
		lanes = append(lanes[s.turn:], lanes[:s.turn]...)
	}
	// The passes woken lately whose looks have not ended their hold yet
	// are on their way to the executor's queue: they take room too.
	room, short := s.room(ctx, stream), false
	for key, w := range woke {
		if now.Sub(w.at) < Rewake && room > 0 && room < math.MaxInt {
			if _, asleep := x.entries[key]; asleep {
				room--
			}
		}
	}
	// Passes waiting their turn share the room: each lane of them takes at
	// most its part, the lanes in turn.
	turns := 0
	for _, l := range lanes {
		if l.hold == events.HoldQueued {
			turns++
		}
	}
	quota := 0
	if turns > 0 {
		quota = max(1, room/turns)
	}
	for _, l := range lanes {
		due = append(due, s.dueOf(l, x.lanes[l], x.entries, now, woke, MaxWakesPerSweep-len(due), &room, quota, &short)...)
		if len(due) >= MaxWakesPerSweep {
			break
		}
	}
	more = len(due) >= MaxWakesPerSweep || short
	x.mu.Unlock()
	// Each wake reads its held event (a round trip), WakeReaders at a
	// time; the wakes are then published in the sweep's order and their
	// acks awaited together: a sweep of a thousand wakes takes a few dozen
	// round trips, not a thousand.
	type sent struct {
		msg *nats.Msg
		ack jetstream.PubAckFuture
		err error
	}
	sends := make([]sent, len(due))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(WakeReaders, len(due)) {
		wg.Go(func() {
			for i := range next {
				sends[i].msg, sends[i].err = s.wakeMsg(ctx, stream, due[i])
			}
		})
	}
	for i := range due {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, w := range due {
		if sends[i].err == nil && sends[i].msg != nil {
			sends[i].ack, sends[i].err = s.cfg.JS.PublishMsgAsync(sends[i].msg, jetstream.WithMsgID(wakeID(w, now)))
		}
		if err := sends[i].err; err != nil {
			if ctx.Err() == nil {
				s.log.Warn("waking a held pass failed; the next sweep tries again", "task", w.entry.Task, "type", w.entry.Type, "err", err)
			}
			continue
		}
		woke[w.entry.Key()] = woken{at: now, n: woke[w.entry.Key()].n + 1, place: w.place, rung: w.entry.Rung, measured: w.measured, tries: w.tries}
	}
	for i, w := range due {
		if sends[i].ack == nil {
			continue
		}
		select {
		case a := <-sends[i].ack.Ok():
			if !a.Duplicate { // another sweeper's wake of this period was stored first
				s.metrics.wakes.WithLabelValues(s.metrics.types.Label(w.entry.Type), w.why).Inc()
			}
		case err := <-sends[i].ack.Err():
			s.log.Warn("waking a held pass failed; it is woken again later", "task", w.entry.Task, "type", w.entry.Type, "err", err)
		case <-ctx.Done():
			return more
		}
	}
	return more
}

// WakeReaders is how many held events a sweep reads from the stream at
// once to republish them as wakes.
const WakeReaders = 16

// dueOf is what a sweep wakes of one type's held passes, keys oldest
// first, at most limit. Of the passes held for trust: each held past the
// hold time; once the type recovered — for a retry, judged on its settled
// tasks — the oldest Readmit, expired ones among them, and while it is on
// probation no more than its free trial places; while it is below, the
// oldest one when a probe is due. Of the passes waiting for canaries: as
// many of the oldest as there are free canary places, each that waited
// the canary TTL, and every one once the canaries' results scored the
// type. Of the retries waiting for a rung: as many as the rung has free
// places, each that waited the canary TTL, and every one once the rung is
// measured. A pass woken lately (woken.due) is left to its look, unless
// its rung moved since (rungMoved).
func (s *Service) dueOf(l lane, keys []string, entries map[string]services.HeldEntry, now time.Time, woke map[string]woken, limit int, room *int, quota int, short *bool) []wake {
	j := s.judge(l.typ, now)
	j.room, j.quota, j.short = room, quota, short
	// The places its passes woken lately are about to ask for: canary
	// places, or trial places.
	switch {
	case l.hold == events.HoldCanary:
		j.places -= wokenLately(keys, woke, now)
	case l.hold == events.HoldRung:
		// Not those whose rung moved since: their looks are over.
		for _, key := range keys {
			if w, ok := woke[key]; ok && now.Sub(w.at) < Rewake && !j.rungMoved(entries[key], w) {
				j.tookRung(entries[key].Rung)
			}
		}
	case l.hold == events.HoldTrust && j.limited:
		j.readmits -= wokenLately(keys, woke, now)
	}
	if l.hold == events.HoldTrust {
		keys = task.WakeOrder(keys, func(k string) time.Time { return entries[k].Since }, j.backlog.NewestFirst(), j.scoring.HoldTime, now)
	}
	var due []wake
	for _, key := range keys {
		if len(due) >= limit {
			break
		}
		e := entries[key]
		if j.quiet(e, now) {
			break // nothing younger can be due
		}
		if w, ok := woke[key]; ok && !w.due(now, j.canaryRound()) && !j.rungMoved(e, w) {
			continue
		}
		if why := j.due(e, now); why != "" {
			due = append(due, j.wake(e, why))
		}
	}
	if (l.hold == events.HoldCanary && j.canaryRound() || l.hold == events.HoldRung) && len(due) == 0 && limit > 0 && now.Sub(s.checked[l]) >= CanaryCheck {
		// Every place looks taken, but a canary (or a retry measuring a
		// rung) that ended with no outcome (cancelled as stale, stopped by
		// a human or the gate) keeps its place in the view until the canary
		// TTL: the oldest waiting pass that was not woken lately looks in
		// full, which frees such places (releaseEnded) and takes one.
		why := WakeCanary
		if l.hold == events.HoldRung {
			why = WakeRung
		}
		for _, key := range keys {
			if w, ok := woke[key]; !ok || now.Sub(w.at) >= Rewake {
				due = append(due, j.wake(entries[key], why))
				s.checked[l] = now
				break
			}
		}
	}
	return due
}

// wokenLately counts the keys woken less than Rewake before now.
func wokenLately(keys []string, woke map[string]woken, now time.Time) int {
	n := 0
	for _, key := range keys {
		if w, ok := woke[key]; ok && now.Sub(w.at) < Rewake {
			n++
		}
	}
	return n
}

// CanaryCheck is how often, at most, the sweeper wakes the oldest pass of a
// type waiting for canaries while every canary place looks taken (dueOf).
const CanaryCheck = 5 * time.Second

// wakeMsg is the wake of the pass entry w names: its held event,
// republished on dispatch.task.<id>.wake for the held consumer to look at;
// nil when there is nothing to publish.
func (s *Service) wakeMsg(ctx context.Context, stream jetstream.Stream, w wake) (*nats.Msg, error) {
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
	return msg, nil
}

// wakeID is the Nats-Msg-Id of w at now: two sweepers that wake a pass
// within the same Rewake period publish one wake. A wake for a canary
// place has an id of its own: the pass's bulk wake once the canaries
// score its type may follow within the period.
func wakeID(w wake, now time.Time) string {
	suffix := "wake-"
	switch {
	case w.place:
		suffix = "wake-place-"
	case w.measured:
		suffix = "wake-measured-" + string(w.entry.Rung) + "-"
	case w.entry.Hold == events.HoldRung:
		// One wake per outcome on the rung: a wake after the next canary's
		// outcome, within the same period, is not the one before it.
		suffix = "wake-" + string(w.entry.Rung) + "-" + strconv.Itoa(w.tries) + "-"
	}
	period := now.Truncate(Rewake).Unix()
	return services.MsgID(w.entry.Task, w.entry.Pass, suffix+strconv.FormatInt(period, 10))
}
