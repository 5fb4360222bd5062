// Package gate is the trust gate: before every model call — a task's first
// pass and each of its retries — it decides whether the call is worth making
// (SPEC §4):
//
//   - a type scoring below its trust threshold over its last tasks (a
//     task's attempts count once; a type with few tasks is scored with the
//     mesh's pooled evidence; a run of failures its history makes unlikely
//     is a regression) is not dispatched: the task is held (status held,
//     no tokens) in the gate's second consumer, gate_held, and re-admitted
//     when a probe of its type succeeds or its score recovers — after
//     ProbeAfter consecutive blocks of new tasks the next goes as a probe,
//     and held tasks send one probe per probe interval; held past the hold
//     time it goes to dispatch.review.gated (needs_human_review);
//   - a type with too few settled tasks to be scored sends one round of
//     canaries (Policy.Canary, or fewer when the pooled evidence decides it
//     sooner), each keeping its place until it ends; the other tasks wait
//     in gate_held, unspent, until the canaries' results score the type;
//   - a retry climbs onto a rung only while the type's retries on that rung
//     — its own, or pooled with its other rungs' and the other types' while
//     it has few — succeed often enough (Policy.RungFloor): otherwise it
//     moves up to the next rung that does (ladder.Skip), and when none does
//     the task is handed to a human now (dispatch.review.escalated, status
//     blocked) instead of paying for an attempt that rarely succeeds;
//   - a type over its daily budget is blocked with cause budget.
//
// Exempt types are never held nor held back as canaries (the rung floor
// still applies to their retries); a task a human requeued goes through.
package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/task"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// ErrCanaryWait is the snooze cause of a pass waiting for its type's
// canaries; ErrHeld of one held for its type's trust.
var (
	ErrCanaryWait = errors.New("gate: waiting for the outcomes of the type's canaries")
	ErrHeld       = errors.New("gate: held for its type's trust")
)

// MaxDeliver bounds the deliveries of one verified pass: the gate decides
// it at once (admitted, held, stopped), so only failures redeliver it.
const MaxDeliver = 20

// MaxHeldDeliver bounds the looks at one held pass: every look is a
// delivery; a pass held for trust is looked at every 15–30s once the
// backoff reached MaxHeldDelay (the default 24h hold: at most 5,760
// looks), one waiting for canaries every 0.25–0.5s (the default 10m TTL: at
// most 2,400). A longer hold time or TTL stretches the delay to fit.
const MaxHeldDeliver = 10_000

// MaxCanaryDelay caps the delay between two looks of a pass waiting for
// canaries: a burst of a new type is admitted about this long after its
// canaries' results score the type.
const MaxCanaryDelay = 500 * time.Millisecond

// MaxHeldDelay caps the delay between two looks of a pass held for trust:
// a type re-opened by a probe gets its held tasks back within it.
const MaxHeldDelay = 30 * time.Second

// Service is the gate handler.
type Service struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	index   atomic.Pointer[heldIndex] // the sweeper's copy of the held index, once current
	bound   atomic.Pointer[jetstream.Stream]
}

// New checks cfg and returns the gate.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, log: cfg.Log.With("service", "gate")}
	s.metrics = newMetrics(cfg, s)
	return s, nil
}

// Spec is the gate's consumer: verified tasks.
func (s *Service) Spec() services.Spec {
	return services.Spec{Name: services.ConsumerGate, Filters: []string{events.StageFilter(events.StageVerified)},
		Handler: s.Handle, Concurrency: 8, Prefetch: services.FastPrefetch, MaxDeliver: MaxDeliver}
}

// HeldSpec is the gate's second consumer: the passes it holds back, and
// the wakes of those asleep in the held index. A held pass waits here, not
// in the verified consumer, so a flood of one type waiting for its
// canaries never holds the verified consumer's pending slots: every other
// type's passes keep being decided. A pass held for trust does not wait
// here either: its look acks it and leaves it asleep in the held index
// (Config.Held), which the sweeper (Sweep, run beside this consumer) wakes
// — so however many passes are held, and for however long, none takes a
// pending slot of this consumer.
func (s *Service) HeldSpec() services.Spec {
	spec := services.Spec{Name: services.ConsumerGateHeld,
		Filters: []string{events.StageFilter(events.StageHeld), events.StageFilter(events.StageWake)},
		Handler: s.HandleHeld, Concurrency: 8, Prefetch: services.FastPrefetch, MaxDeliver: MaxHeldDeliver}
	if s.cfg.Held != nil {
		spec.Beside = s.Sweep
	}
	return spec
}

// Handle decides whether one verified pass may go on to the model.
func (s *Service) Handle(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	var ev events.Verified
	if err := services.Decode(m, &ev); err != nil {
		return nil, err
	}
	return s.decide(ctx, m, ev.Base, ev.Sealed, nil)
}

// HandleHeld looks again at a pass the gate held back: admitted when its
// type's canaries have scored it or its trust recovered (or as a probe of
// its held tasks), looked at later while it must still wait, and sent to
// a human once held for trust past the hold time.
func (s *Service) HandleHeld(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	var ev events.Held
	if err := services.Decode(m, &ev); err != nil {
		return nil, err
	}
	asleep := s.cfg.Held != nil && ev.Hold == events.HoldTrust
	st, found, err := s.taskState(ctx, ev.Task.ID)
	if err != nil {
		return nil, err
	}
	if asleep && found && task.Held(st, ev.Run.Pass) {
		// Admitted by an earlier look, the pass still shows held until the
		// executor starts it: a wake published meanwhile must not hold it
		// again.
		if found, err = s.admitted(ctx, ev.Task.ID, ev.Run.Pass); err != nil {
			return nil, err
		} else if found {
			s.log.Info("held pass dropped: an earlier look admitted it", "task", ev.Task.ID, "pass", ev.Run.Pass)
			return nil, s.cfg.Held.Delete(ctx, heldKey(ev))
		}
		found = true
	}
	if found && movedOn(st, ev.Run.Pass) {
		s.log.Info("held pass dropped: the task moved on or ended", "task", ev.Task.ID, "pass", ev.Run.Pass, "status", st.Status)
		if asleep {
			return nil, s.cfg.Held.Delete(ctx, heldKey(ev))
		}
		return nil, nil
	}
	outs, err := s.decide(ctx, m, ev.Base, ev.Sealed, &ev)
	switch {
	case !asleep:
		return outs, err
	case errors.Is(err, errAsleep): // its entry is in the index: the message is done
		return nil, nil
	case err != nil:
		return nil, err
	}
	// The look ended the hold — admitted, to a human, or a human acted on
	// the task — so its entry goes. Should publishing what it decided
	// fail, the message is looked at again: nothing is lost.
	return outs, s.cfg.Held.Delete(ctx, heldKey(ev))
}

// admitted reports whether the stream holds the admission of the task's
// pass: the newest admitted event on its subject is of that pass.
func (s *Service) admitted(ctx context.Context, id string, pass int) (bool, error) {
	stream, err := s.stream(ctx)
	if err != nil {
		return false, err
	}
	raw, err := stream.GetLastMsgForSubject(ctx, events.TaskSubject(id, events.StageAdmitted))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return raw.Header.Get(events.HeaderPass) == strconv.Itoa(pass), nil
}

// stream is the task stream, bound once.
func (s *Service) stream(ctx context.Context) (jetstream.Stream, error) {
	if st := s.bound.Load(); st != nil {
		return *st, nil
	}
	st, err := s.cfg.JS.Stream(ctx, services.Stream)
	if err != nil {
		return nil, err
	}
	s.bound.Store(&st)
	return st, nil
}

// errAsleep ends a look that left its pass asleep in the held index.
var errAsleep = errors.New("gate: the held pass sleeps in the held index")

// heldKey is the held index key of the pass ev holds.
func heldKey(ev events.Held) string {
	return services.HeldKey(ev.Task.Type, ev.At, ev.Task.ID, ev.Run.Pass)
}

// sleep ends a look at a pass held for trust that must go on waiting:
// with the held index, the pass sleeps there until the sweeper wakes it
// (errAsleep: HandleHeld acks the message); without one, the message is
// snoozed in the held consumer.
func (s *Service) sleep(ctx context.Context, m *services.Msg, p trust.Policy, held *events.Held) error {
	if s.cfg.Held == nil {
		return services.Snooze(heldDelay(m.Delivered, p.HoldTime), ErrHeld)
	}
	e := services.HeldEntry{Task: held.Task.ID, Type: held.Task.Type, Pass: held.Run.Pass, Retry: held.Run.Attempt > 1,
		Since: held.At, Seq: m.Seq, Reason: held.Reason}
	if err := s.cfg.Held.Put(ctx, e); err != nil {
		return err
	}
	return errAsleep
}

// movedOn reports whether a held look at pass is stale: the task is at a
// later pass (a human's requeue), a human ended it, or the pass was
// admitted already (running, or its attempt recorded: a look redelivered
// after the admission it decided). A stop of the pass by the gate (a
// handoff, a hold past its time) is not: the look goes on to republish
// its record (stopped).
func movedOn(st events.TaskState, pass int) bool {
	switch {
	case st.Pass > pass:
		return true
	case events.Terminal(st.Status) && task.EndedByHuman(st):
		return true
	case st.Pass == pass && st.Status == events.StatusRunning:
		return true
	}
	return task.Attempted(st, pass)
}

// decide is the gate's decision on a pass, verified (held nil) or held.
func (s *Service) decide(ctx context.Context, m *services.Msg, b events.Base, sealed *events.Sealed, held *events.Held) ([]services.Out, error) {
	snap := s.cfg.Policy.Snapshot()
	b.At, b.By, b.PolicyRev = s.cfg.Now().UTC(), s.cfg.Instance, snap.Rev
	t := b.Task
	pol := snap.For(t.Type)
	scoring := pol.Scoring(s.cfg.Scoring).WithDefaults()
	scoring.Exempt = []string{} // the policy says which types are exempt
	retry := b.Run.Attempt > 1
	evaluate := func() (trust.Stats, trust.Verdict) {
		stats := s.cfg.View.Stats(t.Type)
		return stats, scoring.EvaluateWith(t.Type, stats, scoring.PriorOf(s.pool(), t.Type), retry)
	}
	stats, v := evaluate()
	// Most looks at a pass waiting for canaries find every place still
	// taken: they read nothing from the server (quickLook); one in
	// FullLookEvery does the full look, which also frees the places of
	// canaries a human ended.
	quickLook := held != nil && held.Hold == events.HoldCanary && m.Delivered%FullLookEvery != 0
	// A flood of a new type: a pass that arrives while the view shows
	// every canary place taken goes to the held consumer at once, reading
	// nothing, so the verified consumer keeps its pace for every other
	// type. The held consumer makes the full look.
	if held == nil && m.Delivered == 1 && waitsForCanaries(b.Run, v, scoring, pol.IsExempt()) {
		sc := s.withCanaries(scoring, t.Type)
		if b.At.Sub(m.Time) < sc.CanaryTTL && placesTaken(stats, sc, b.At, t.ID) {
			s.metrics.waits.WithLabelValues(s.metrics.types.Label(t.Type)).Inc()
			d := events.TrustDecision{Score: v.Score, Outcomes: v.Outcomes, Threshold: v.Threshold,
				Cause: events.CauseUnproven, Reason: fmt.Sprintf("waiting for the canaries of %s", t.Type)}
			return s.park(b, events.HoldCanary, d, sealed)
		}
	}
	if !quickLook && mayHinge(b.Run, v, scoring, pol.IsExempt()) {
		// Every outcome of the type stored before this pass reached the
		// gate must count — a retry's own previous one, those a client saw
		// end before it submitted this task — and the view may not have
		// received the newest yet: one small read makes sure.
		if err := s.cfg.View.Sync(ctx, t.Type); err != nil {
			return nil, err
		}
		stats, v = evaluate()
	}
	d := events.TrustDecision{Score: v.Score, Outcomes: v.Outcomes, Threshold: v.Threshold, Exempt: pol.IsExempt()}
	gateKey := services.MsgID(t.ID, b.Run.Pass, "gate")
	var (
		spent trust.Spend
		err   error
	)
	if pol.DailyBudget != nil {
		if s.cfg.Spending == nil {
			return nil, fmt.Errorf("gate: type %s has a daily budget but the gate has no spend counters", t.Type)
		}
		if spent, err = s.cfg.Spending.On(ctx, t.Type, b.At); err != nil {
			return nil, err
		}
	}
	// A redelivered pass that an earlier delivery stopped stays stopped (a
	// human's requeue too: the daily budget may have stopped it).
	if m.Delivered > 1 || held != nil {
		if outs, ok, err := s.stopped(ctx, b, d); ok || err != nil {
			return outs, err
		}
	}
	// A canary that the gate stops gives up its place.
	release := ""
	if slices.ContainsFunc(stats.Canaries, func(c trust.Canary) bool { return c.Key == t.ID }) {
		release = t.ID
	}

	overBudget := pol.DailyBudget.Exceeded(spent.Tokens, spent.Cost)
	if overBudget && b.Run.Reviewed {
		// A human's requeue is let past a spent budget for its own pass —
		// the human asked for that call — not for the retries of the round
		// it starts: they would spend past the cap on their own.
		requeue, err := s.requeuePass(ctx, b)
		if err != nil {
			return nil, err
		}
		overBudget = !requeue
	}
	switch {
	case overBudget:
		d.Blocked, d.Cause = true, events.CauseBudget
		d.Reason = fmt.Sprintf("Blocked: %s budget: spent %d tokens and $%.4f today, over its daily budget", t.Type, spent.Tokens, spent.Cost)
		return s.block(ctx, b, d, release)
	case b.Run.Reviewed:
		d.Cause, d.Reason = events.CauseReviewed, "requeued by a human reviewer"
		return s.admit(ctx, b, d, sealed)
	case d.Exempt:
		d.Cause = events.CauseExempt
	case b.Run.Probe:
		d.Cause = events.CauseProbe // a probe's retries go on: it re-measures the type
	case v.Below:
		// Held, not handed to a human: the type may recover (a probe
		// succeeds, the score climbs back) and take its held tasks back.
		if ended, err := s.endedByHuman(ctx, b); ended || err != nil {
			return nil, err
		}
		probe, err := s.probe(ctx, b, scoring, held, gateKey, stats.Outcomes)
		if err != nil {
			return nil, err
		}
		if !probe {
			d.Cause, d.Reason = events.CauseTrust, v.Reason
			if held != nil && held.Hold == events.HoldTrust && b.At.Sub(held.At) >= scoring.HoldTime {
				d.Blocked = true
				d.Reason = fmt.Sprintf("%s; held %s without recovering", v.Reason, scoring.HoldTime)
				return s.block(ctx, b, d, release)
			}
			return s.hold(ctx, m, scoring, b, d, sealed, held, release)
		}
		d.Probe, d.Cause, b.Run.Probe = true, events.CauseProbe, true
		s.log.Info("exploration probe let through", "task", t.ID, "type", t.Type, "score", v.Score, "held", held != nil)
	case v.Unproven && scoring.Threshold >= 0:
		d.Cause = events.CauseUnproven
	default:
		d.Cause = events.CauseTrusted
		if step, below := trust.StreakStep(d.Cause, false, b.Run.Attempt, false); step && stats.BlockStreak > 0 { // the type recovered: the block streak ends
			if _, _, err := s.cfg.Trust.GateUnder(ctx, scoring, t.Type, gateKey, below); err != nil {
				return nil, err
			}
		}
	}

	if held != nil && held.Hold == events.HoldTrust && v.Probation && !b.Run.Probe {
		// Re-admitted on a probe's word alone: a few at a time, more with
		// every success (a slow start), so a lucky probe of a type that
		// still fails does not send the whole backlog.
		ok, err := s.trial(ctx, t, b.At, scoring, stats)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, s.sleep(ctx, m, scoring, held)
		}
		d.Reason = fmt.Sprintf("re-admitted: a probe of %s succeeded (%d at a time until its score recovers)", t.Type, scoring.TrialPlaces(stats))
	}

	if retry && b.Run.Rung != "" {
		pool := s.pool()
		explore := services.MsgID(t.ID, b.Run.Pass, "explore") // the retry's own rung may be explored
		below := func(rung events.Rung) bool {
			key := ""
			if rung == b.Run.Rung {
				key = explore
			}
			low, _, _ := scoring.RungBelowWith(stats, rung, pool, key)
			return low
		}
		_, tries, successes := scoring.RungBelowWith(stats, b.Run.Rung, pool, explore)
		d.RungTries, d.RungSuccesses = tries, successes
		measured := fmt.Sprintf("%s retries of %s succeeded %d of %d times, below the floor of %.0f%%",
			b.Run.Rung, t.Type, successes, tries, 100*scoring.RungFloor)
		if tries < scoring.RungMinSamples {
			measured = fmt.Sprintf("%s retries of %s succeeded %d of %d times: too few to judge alone, and with its retries on every rung and %s below the floor of %.0f%%",
				b.Run.Rung, t.Type, successes, tries, pooledRungs(pool, t.Type, b.Run.Rung), 100*scoring.RungFloor)
		}
		switch next := ladder.Skip(b.Run.Rung, ladder.ResearchUsed(b.Run.DeadEnds), below); next {
		case b.Run.Rung:
		case events.RungHandoff:
			d.Cause = events.CauseRungRate
			d.Reason = fmt.Sprintf("HANDOFF before attempt %d: %s, and so do the rungs above it", b.Run.Attempt, measured)
			return s.handoff(ctx, b, d, release)
		default:
			d.Rung, d.Reason = next, fmt.Sprintf("attempt %d runs on %s: %s", b.Run.Attempt, next, measured)
			s.log.Info("retry moved up the ladder", "task", t.ID, "type", t.Type, "from", b.Run.Rung, "to", next)
			b.Run.Rung = next
		}
	}

	if canaryRound(b.Run, v, scoring, d.Exempt) {
		scoring = s.withCanaries(scoring, t.Type)
		if quickLook && b.At.Sub(held.At) < scoring.CanaryTTL && placesTaken(stats, scoring, b.At, t.ID) {
			s.metrics.waits.WithLabelValues(s.metrics.types.Label(t.Type)).Inc()
			return nil, services.Snooze(canaryDelay(m.Delivered, scoring.CanaryTTL), ErrCanaryWait)
		}
		if held == nil { // a held look read the state already (HandleHeld)
			if ended, err := s.endedByHuman(ctx, b); ended || err != nil {
				return nil, err
			}
		}
		admit, err := s.cfg.Trust.Canary(ctx, t.Type, t.ID, b.At, scoring, stats.Outcomes)
		if err != nil {
			return nil, err
		}
		if !admit { // places held by tasks that ended are free
			if freed, err := s.releaseEnded(ctx, t.Type, t.ID); err != nil {
				return nil, err
			} else if freed {
				if admit, err = s.cfg.Trust.Canary(ctx, t.Type, t.ID, b.At, scoring, stats.Outcomes); err != nil {
					return nil, err
				}
			}
		}
		waited := b.At.Sub(m.Time) // since it reached the gate's stream position
		if held != nil {
			waited = b.At.Sub(held.At) // since the gate first held it
		}
		if !admit && waited < scoring.CanaryTTL {
			s.metrics.waits.WithLabelValues(s.metrics.types.Label(t.Type)).Inc()
			if held == nil { // to the held consumer: this one decides the others
				d.Cause, d.Reason = events.CauseUnproven, fmt.Sprintf("waiting for the canaries of %s", t.Type)
				return s.park(b, events.HoldCanary, d, sealed)
			}
			delay := canaryDelay(m.Delivered, scoring.CanaryTTL)
			s.log.Debug("waiting for canaries", "task", t.ID, "type", t.Type, "outcomes", v.Outcomes, "delay", delay)
			return nil, services.Snooze(delay, ErrCanaryWait)
		}
		if !admit {
			d.Reason = fmt.Sprintf("waited %s for the canaries of %s: let through", waited.Round(time.Second), t.Type)
		}
	}
	return s.admit(ctx, b, d, sealed)
}

// waitsForCanaries reports whether a new task's first pass of a type the
// view shows unproven would wait for its canaries if every place is
// taken: none of the decisions that come first (a human's requeue, an
// exempt type, a probe, a type below its threshold) applies to it.
func waitsForCanaries(run events.Run, v trust.Verdict, p trust.Policy, exempt bool) bool {
	return run.Pass == 1 && run.Attempt <= 1 && !run.Reviewed && !v.Below && canaryRound(run, v, p, exempt)
}

// canaryRound reports whether a pass let through is one of its type's
// canaries, or waits for them: the type is unproven, gated, not exempt,
// and the pass is no probe.
func canaryRound(run events.Run, v trust.Verdict, p trust.Policy, exempt bool) bool {
	return v.Unproven && !exempt && !run.Probe && p.Threshold >= 0
}

// withCanaries is p with its canary count for taskType: one round, as many
// canaries as the type's evidence needs to be decided with the mesh's (the
// prior's Sample), MinOutcomes without.
func (s *Service) withCanaries(p trust.Policy, taskType string) trust.Policy {
	p.Canary = p.CanariesWith(p.PriorOf(s.pool(), taskType))
	return p
}

// FullLookEvery: one look in this many at a pass waiting for canaries
// reads the server whatever the view shows (see quickLook).
const FullLookEvery = 8

// placesTaken reports whether the view shows every canary place of the
// type taken by another task still in flight — unexpired, with no final
// result among the type's outcomes — so a look would be refused.
func placesTaken(stats trust.Stats, p trust.Policy, now time.Time, self string) bool {
	if p.Canary < 0 {
		return false
	}
	ended := map[string]bool{}
	for _, r := range trust.Tasks(stats.Outcomes) {
		if r.Settled() {
			ended[r.Task] = true
		}
	}
	taken := 0
	for _, c := range stats.Canaries {
		if c.Key != self && now.Sub(c.At) < p.CanaryTTL && !ended[c.Key] {
			taken++
		}
	}
	return taken >= p.Canary
}

// pool is the mesh's pooled evidence, every type's window as the
// mesh-wide scoring takes it (a type's own window may differ: the pool is
// what the mesh knows, the same for every type).
func (s *Service) pool() *trust.Pool { return s.cfg.View.Pool(s.cfg.Scoring) }

// pooledRungs says what the other types' retries on rung tell.
func pooledRungs(pool *trust.Pool, taskType string, rung events.Rung) string {
	mean, types := pool.Rung(taskType, rung)
	if types < 2 {
		return "nothing pooled from other types"
	}
	return fmt.Sprintf("%.0f%% for %d other types", 100*mean, types)
}

// probe decides whether a pass of a type below its threshold goes through
// as an exploration probe: a new task after ProbeAfter consecutive blocks
// of new tasks (the block streak, SPEC §4; a task that waited for its
// canaries counts as new); a task held for trust once the type's probe
// interval has passed since its last probe of held tasks (doubled per
// failed probe in a row), so a backlog of held tasks sends one probe per
// interval however often they are looked at. A retry held on arrival
// takes no step of the streak.
// outcomes are the type's, as the decision read them.
func (s *Service) probe(ctx context.Context, b events.Base, p trust.Policy, held *events.Held, gateKey string, outcomes []trust.Outcome) (bool, error) {
	t := b.Task
	heldForTrust := held != nil && held.Hold == events.HoldTrust
	if heldForTrust {
		return s.cfg.Trust.HeldProbe(ctx, p, t.Type, b.At, outcomes)
	}
	if step, _ := trust.StreakStep(events.CauseTrust, false, b.Run.Attempt, heldForTrust); !step {
		return false, nil
	}
	probe, streak, err := s.cfg.Trust.GateUnder(ctx, p, t.Type, gateKey, true)
	if err == nil && !probe {
		s.log.Info("task held", "task", t.ID, "type", t.Type, "pass", b.Run.Pass, "streak", streak)
	}
	return probe, err
}

// hold holds the pass for its type's trust: the task's status is held
// (SPEC §2), and the pass waits in the held consumer, looked at again
// every few seconds (held: snoozed; verified: handed over as a held event).
func (s *Service) hold(ctx context.Context, m *services.Msg, p trust.Policy, b events.Base, d events.TrustDecision, sealed *events.Sealed, held *events.Held, release string) ([]services.Out, error) {
	if err := s.release(ctx, b.Task.Type, release); err != nil {
		return nil, err
	}
	if s.cfg.Tasks != nil {
		_, cause, err := s.cfg.Tasks.Apply(ctx, b.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Hold(st, found, b, d.Reason)
		})
		if err != nil {
			return nil, err
		}
		switch {
		case cause == task.CauseMovedOn, cause == task.CauseEnded:
			return nil, nil // a human acted on it meanwhile
		case cause.Changed():
			s.metrics.held.WithLabelValues(s.metrics.types.Label(b.Task.Type)).Inc()
			s.log.Info("task held for its type's trust", "task", b.Task.ID, "type", b.Task.Type, "pass", b.Run.Pass, "reason", d.Reason)
			sealed = nil // the state changed since it was sealed: the executor reads
		}
	}
	if held == nil || held.Hold != events.HoldTrust { // a new hold: its event, and this message is done
		return s.park(b, events.HoldTrust, d, sealed)
	}
	return nil, s.sleep(ctx, m, p, held)
}

// park hands a pass to the held consumer, held for hold: one held event
// per pass and hold (its Nats-Msg-Id names both), so a pass that waited for
// its canaries and is then held for trust is held anew.
func (s *Service) park(b events.Base, hold events.Hold, d events.TrustDecision, sealed *events.Sealed) ([]services.Out, error) {
	if hold == events.HoldTrust { // a wait for canaries is no decision: dispatch_gate_waits_total counts it
		s.decided(context.Background(), b, d)
	}
	out, err := services.NextAs(b, events.StageHeld, events.StageHeld+"-"+string(hold), events.EventHeld,
		events.Held{Base: b, Hold: hold, Trust: d, Reason: d.Reason, Sealed: sealed})
	return []services.Out{out}, err
}

// heldDelay is how long a held pass sleeps before it is looked at again:
// 1s doubling per look up to MaxHeldDelay, with jitter — longer for a hold
// time so long that MaxHeldDeliver looks would not cover it.
func heldDelay(delivered int, holdTime time.Duration) time.Duration {
	return backoff(delivered, time.Second, max(MaxHeldDelay, spread(holdTime)))
}

// spread is the longest delay between looks for MaxHeldDeliver looks to
// cover d, with the jitter's shortest (half the delay) taken at each.
func spread(d time.Duration) time.Duration { return 2 * d / MaxHeldDeliver }

// backoff is base doubling per delivery up to limit, with jitter (half to
// all of it) so that a burst does not come back all at once.
func backoff(delivered int, base, limit time.Duration) time.Duration {
	d := base
	for i := 1; i < delivered && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return d/2 + rand.N(d/2+1)
}

// SyncMargin is how close to its threshold a type's score must be, at
// least, for the gate to make sure its view holds the type's newest
// outcomes before it decides (see mayHinge). One outcome moves the default
// 50-outcome window's score by at most about 0.05; the view lags the stream
// by far fewer outcomes than that margin allows, even in a burst. A smaller
// window (a type's trust_window) moves more per outcome: its margin is two
// outcomes' worth (syncMargin).
const SyncMargin = 0.1

// syncMargin is SyncMargin, or two outcomes' worth of p's score when one
// outcome moves it more: the plain rate by 1/window, the recency rate by
// the newest outcome's share of the recency weights.
func syncMargin(p trust.Policy) float64 {
	n := float64(max(p.Window, 1))
	total := n // the recency weights' sum, Σ decay^i over the window
	if p.Decay < 1 {
		total = (1 - math.Pow(p.Decay, n)) / (1 - p.Decay)
	}
	step := p.OverallWeight/n + p.RecencyWeight/max(total, 1)
	return max(SyncMargin, 2*step)
}

// mayHinge reports whether the decision on a pass could depend on an
// outcome the gate's view has not received yet, so the view is synced
// first: a retry (its own previous outcome counts for its rung's rate and
// its type's trust), a type still unproven (its outcomes decide canaries
// and the moment it is scored), or one whose score is near its threshold.
// Elsewhere an outcome or two more cannot change what the gate decides,
// and a pass costs no read: a human's requeue (admitted whatever the
// score), and the first pass of a type never gated (exempt, or a negative
// threshold: no canaries either).
func mayHinge(run events.Run, v trust.Verdict, p trust.Policy, exempt bool) bool {
	switch {
	case run.Reviewed:
		return false
	case run.Pass > 1:
		return true
	case exempt || p.Threshold < 0:
		return false
	case v.Unproven:
		return true
	}
	return math.Abs(v.Score-p.Threshold) < syncMargin(p)
}

// requeuePass reports whether b's pass is the one a human's requeue sent
// (the first attempt of the round it started), not a retry in that round.
func (s *Service) requeuePass(ctx context.Context, b events.Base) (bool, error) {
	st, found, err := s.taskState(ctx, b.Task.ID)
	if err != nil || !found {
		return err == nil, err
	}
	return b.Run.Attempt <= st.RoundStart+1, nil
}

// taskState is the task's stored state; found is false when the task has
// none, or the gate keeps no task store.
func (s *Service) taskState(ctx context.Context, id string) (st events.TaskState, found bool, err error) {
	if s.cfg.Tasks == nil {
		return st, false, nil
	}
	st, err = s.cfg.Tasks.Get(ctx, id)
	if errors.Is(err, services.ErrTaskNotFound) {
		return st, false, nil
	}
	return st, err == nil, err
}

// endedByHuman reports whether a human ended the task (cancelled it) before
// this pass: it then takes no canary place, no probe and no step of the
// block streak. Only those decisions read the task's state: a pass the gate
// simply admits needs no read, and the executor skips a task that ended.
func (s *Service) endedByHuman(ctx context.Context, b events.Base) (bool, error) {
	st, found, err := s.taskState(ctx, b.Task.ID)
	if err != nil || !found {
		return false, err
	}
	if st.Pass >= b.Run.Pass && task.EndedByHuman(st) {
		s.log.Info("task ended by a human: not admitted", "task", b.Task.ID, "status", st.Status)
		return true, nil
	}
	return false, nil
}

// releaseEnded gives up the canary places of taskType held by tasks that
// have ended — with their outcomes recorded, or cancelled or resolved by a
// human — and reports whether it freed any. A canary's place is given back
// here, by the next pass that asks for one, not by whoever ended it: the
// recorder writes no gate facts. It reads the holders' states only when a
// pass is refused a place, at most Policy.Canary reads.
func (s *Service) releaseEnded(ctx context.Context, taskType, self string) (bool, error) {
	if s.cfg.Tasks == nil {
		return false, nil
	}
	stats, err := s.cfg.Trust.Get(ctx, taskType)
	if err != nil {
		return false, err
	}
	freed := false
	for _, c := range stats.Canaries {
		if c.Key == self {
			continue
		}
		st, err := s.cfg.Tasks.Get(ctx, c.Key)
		if errors.Is(err, services.ErrTaskNotFound) {
			continue
		}
		if err != nil {
			return false, err
		}
		if !events.Terminal(st.Status) {
			continue
		}
		if _, err := s.cfg.Trust.Release(ctx, taskType, c.Key); err != nil {
			return false, err
		}
		s.log.Info("canary place of an ended task released", "type", taskType, "task", c.Key, "status", st.Status)
		freed = true
	}
	return freed, nil
}

// trial asks for a trial place for a held task of a type on probation,
// freeing the places of tasks that ended when every place is taken.
func (s *Service) trial(ctx context.Context, t events.Task, now time.Time, p trust.Policy, stats trust.Stats) (bool, error) {
	places := p.TrialPlaces(stats)
	ok, err := s.cfg.Trust.Trial(ctx, t.Type, t.ID, now, p, places)
	if ok || err != nil {
		return ok, err
	}
	if freed, err := s.releaseEnded(ctx, t.Type, t.ID); err != nil || !freed {
		return false, err
	}
	return s.cfg.Trust.Trial(ctx, t.Type, t.ID, now, p, places)
}

// canaryDelay is how long a waiting pass sleeps before it looks again:
// 250ms doubling per look up to MaxCanaryDelay (longer for a canary TTL
// that MaxHeldDeliver looks would not cover), with jitter.
func canaryDelay(delivered int, ttl time.Duration) time.Duration {
	return backoff(delivered, 250*time.Millisecond, max(MaxCanaryDelay, spread(ttl)))
}

// admit lets the pass through to the prompt builder, with the task's state
// sealed as it came (the gate does not write it on the way).
func (s *Service) admit(ctx context.Context, b events.Base, d events.TrustDecision, sealed *events.Sealed) ([]services.Out, error) {
	s.decided(ctx, b, d)
	out, err := services.Next(b, events.StageAdmitted, events.EventAdmitted, events.Admitted{Base: b, Trust: d, Sealed: sealed})
	return []services.Out{out}, err
}

// block files the task for human review with status needs_human_review,
// with what was tried when a retry is stopped.
func (s *Service) block(ctx context.Context, b events.Base, d events.TrustDecision, release string) ([]services.Out, error) {
	if err := s.release(ctx, b.Task.Type, release); err != nil {
		return nil, err
	}
	s.decided(ctx, b, d)
	var attempts []events.AttemptRecord
	if s.cfg.Tasks != nil {
		st, cause, err := s.cfg.Tasks.Apply(ctx, b.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Block(st, found, b, d.Reason, d.Cause)
		})
		if err != nil {
			return nil, err
		}
		if cause.Changed() {
			s.metrics.tasks.Finish(b.Task.Type, st.Status, services.EndedByGate, b.At.Sub(b.Task.SubmittedAt))
		} else if st.Pass >= b.Run.Pass && task.EndedByHuman(st) {
			return nil, nil // a human ended it: no review record for it
		}
		attempts = st.History
	}
	out, err := services.ToReview(b, events.ReviewGated, events.EventGated, d.Reason,
		events.Gated{Base: b, Trust: d, Reason: d.Reason, Attempts: attempts})
	if err != nil || b.Run.Attempt <= 1 {
		return []services.Out{out}, err
	}
	// A retry stopped ends a task that made attempts: its type's trust
	// counts it as settled (trust.EndMarker).
	marker, err := trust.OutcomeMsg(b.Task.Type, trust.EndMarker(b.Task.ID, b.Run.Pass, b.At))
	return []services.Out{services.OutMsg(marker), out}, err
}

// handoff stops the task before an attempt that would rarely succeed: one
// escalation record, status blocked — the end of its ladder.
func (s *Service) handoff(ctx context.Context, b events.Base, d events.TrustDecision, release string) ([]services.Out, error) {
	if err := s.release(ctx, b.Task.Type, release); err != nil {
		return nil, err
	}
	s.decided(ctx, b, d)
	var st events.TaskState
	if s.cfg.Tasks != nil {
		var cause task.Cause
		var err error
		// A redelivery: the record is republished as it was.
		st, cause, err = s.cfg.Tasks.Apply(ctx, b.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.HandOff(st, found, b, d.Reason)
		})
		if err != nil {
			return nil, err
		}
		if cause.Changed() {
			s.metrics.tasks.Finish(b.Task.Type, st.Status, services.EndedByGate, b.At.Sub(b.Task.SubmittedAt))
		} else if st.Pass >= b.Run.Pass && task.EndedByHuman(st) {
			return nil, nil // a human ended it: no review record for it
		}
	}
	s.log.Info("task handed off before a retry", "task", b.Task.ID, "type", b.Task.Type, "reason", d.Reason)
	// The task ended without an attempt: its type's trust counts it as
	// settled (trust.EndMarker), published before its record.
	marker, err := trust.OutcomeMsg(b.Task.Type, trust.EndMarker(b.Task.ID, b.Run.Pass, b.At))
	if err != nil {
		return nil, err
	}
	out, err := services.ToReview(b, events.ReviewEscalated, events.EventEscalated, d.Reason, events.Escalated{
		Base: b, Reason: d.Reason, Cause: d.Cause, TrustScore: d.Score, Attempts: st.History,
		TokensIn: st.TokensIn, TokensOut: st.TokensOut, Cost: st.Cost,
	})
	return []services.Out{services.OutMsg(marker), out}, err
}

// decided counts the gate's decision on the pass once the event carrying it
// is stored: a redelivered pass republishes the same event, deduplicated,
// and counts nothing (services.OnStored); a pass stopped with no record (a
// human ended the task) counts nothing.
func (s *Service) decided(ctx context.Context, b events.Base, d events.TrustDecision) {
	services.OnStored(ctx, func() { s.metrics.decisions.WithLabelValues(s.metrics.types.Label(b.Task.Type), string(d.Cause)).Inc() })
}

// release gives up the canary place of a task the gate stops.
func (s *Service) release(ctx context.Context, taskType, id string) error {
	if id == "" {
		return nil
	}
	_, err := s.cfg.Trust.Release(ctx, taskType, id)
	return err
}
