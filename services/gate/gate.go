// Package gate is the trust gate: before every model call — a task's first
// pass and each of its retries — it decides whether the call is worth making
// (SPEC §4):
//
//   - a type scoring below its trust threshold over its last tasks (a
//     task's attempts count once; a type with few tasks is scored with the
//     mesh's pooled evidence; a run of failures its history makes unlikely
//     is a regression) is not dispatched: the task is held (status held,
//     no tokens) — asleep in the held index, not in any consumer's pending
//     messages (sweep.go) — and re-admitted, oldest first,
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
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/policy"
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

// decide is the gate's decision on a pass, verified (held nil) or held:
// it reads what the pass needs (the type's evidence from the view, its
// spend, its state when it may have been stopped), decides its cause
// (decideCause), moves a retry up the ladder or hands it off (climb), and
// lets a pass of an unproven type through as a canary or makes it wait
// (canaries).
func (s *Service) decide(ctx context.Context, m *services.Msg, b events.Base, sealed *events.Sealed, held *events.Held) ([]services.Out, error) {
	snap := s.cfg.Policy.Snapshot()
	b.At, b.By, b.PolicyRev = s.cfg.Now().UTC(), s.cfg.Instance, snap.Rev
	t := b.Task
	l := &look{m: m, b: b, sealed: sealed, held: held, pol: snap.For(t.Type)}
	l.scoring = l.pol.Scoring(s.cfg.Scoring).WithDefaults()
	l.scoring.Exempt = []string{} // the policy says which types are exempt
	s.evaluate(l)
	// Most looks at a pass waiting for canaries find every place still
	// taken: they read nothing from the server (quickLook); one in
	// FullLookEvery does the full look, which also frees the places of
	// canaries a human ended.
	l.quick = held != nil && held.Hold == events.HoldCanary && m.Delivered%FullLookEvery != 0
	if outs, parked, err := s.flood(l); parked {
		return outs, err
	}
	if !l.quick && mayHinge(b.Run, l.v, l.scoring, l.pol.IsExempt()) {
		// Every outcome of the type stored before this pass reached the
		// gate must count — a retry's own previous one, those a client saw
		// end before it submitted this task — and the view may not have
		// received the newest yet: one small read makes sure.
		if err := s.cfg.View.Sync(ctx, t.Type); err != nil {
			return nil, err
		}
		s.evaluate(l)
	}
	l.d = events.TrustDecision{Score: l.v.Score, Outcomes: l.v.Outcomes, Threshold: l.v.Threshold, Exempt: l.pol.IsExempt()}
	var spent trust.Spend
	if l.pol.DailyBudget != nil {
		if s.cfg.Spending == nil {
			return nil, fmt.Errorf("gate: type %s has a daily budget but the gate has no spend counters", t.Type)
		}
		var err error
		if spent, err = s.cfg.Spending.On(ctx, t.Type, b.At); err != nil {
			return nil, err
		}
	}
	// A redelivered pass that an earlier delivery stopped stays stopped (a
	// human's requeue too: the daily budget may have stopped it).
	if m.Delivered > 1 || held != nil {
		if outs, ok, err := s.stopped(ctx, b, l.d); ok || err != nil {
			return outs, err
		}
	}
	// A canary that the gate stops gives up its place.
	if slices.ContainsFunc(l.stats.Canaries, func(c trust.Canary) bool { return c.Key == t.ID }) {
		l.release = t.ID
	}
	if outs, done, err := s.decideCause(ctx, l, spent); done || err != nil {
		return outs, err
	}
	if held != nil && held.Hold == events.HoldTrust && l.v.Probation && !l.b.Run.Probe {
		// Re-admitted on a probe's word alone: a few at a time, more with
		// every success (a slow start), so a lucky probe of a type that
		// still fails does not send the whole backlog.
		ok, err := s.trial(ctx, t, l.b.At, l.scoring, l.stats)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, s.sleep(ctx, m, l.scoring, held)
		}
		l.d.Reason = fmt.Sprintf("re-admitted: a probe of %s succeeded (%d at a time until its score recovers)", t.Type, l.scoring.TrialPlaces(l.stats))
	}
	if l.b.Run.Attempt > 1 && l.b.Run.Rung != "" {
		if handoff := s.climb(l); handoff {
			return s.handoff(ctx, l.b, l.d, l.release)
		}
	}
	if canaryRound(l.b.Run, l.v, l.scoring, l.d.Exempt) {
		if outs, done, err := s.canaries(ctx, l); done || err != nil {
			return outs, err
		}
	}
	return s.admit(ctx, l.b, l.d, l.sealed)
}

// look is one decision on a pass: what it read and what it decided so far.
type look struct {
	m       *services.Msg
	b       events.Base // the pass, as it will go on
	sealed  *events.Sealed
	held    *events.Held // nil for a verified pass
	pol     policy.Type
	scoring trust.Policy
	stats   trust.Stats   // the type's evidence, from the view
	v       trust.Verdict // its score under scoring
	d       events.TrustDecision
	release string // the task's canary place, given up if the gate stops it
	quick   bool   // a look at a waiting pass that reads nothing (see decide)
}

// evaluate reads the type's evidence from the view and scores it: a retry
// on its settled tasks only.
func (s *Service) evaluate(l *look) {
	t := l.b.Task
	l.stats = s.cfg.View.Stats(t.Type)
	l.v = l.scoring.EvaluateWith(t.Type, l.stats, l.scoring.PriorOf(s.pool(), t.Type), l.b.Run.Attempt > 1)
}

// flood parks a pass of a flood of a new type: one that arrives while
// the view shows every canary place taken goes to the held consumer at
// once, reading nothing, so the verified consumer keeps its pace for
// every other type. The held consumer makes the full look.
func (s *Service) flood(l *look) (outs []services.Out, parked bool, err error) {
	t := l.b.Task
	if l.held != nil || l.m.Delivered != 1 || !waitsForCanaries(l.b.Run, l.v, l.scoring, l.pol.IsExempt()) {
		return nil, false, nil
	}
	sc := s.withCanaries(l.scoring, t.Type)
	if l.b.At.Sub(l.m.Time) >= sc.CanaryTTL || !placesTaken(l.stats, sc, l.b.At, t.ID) {
		return nil, false, nil
	}
	s.metrics.waits.WithLabelValues(s.metrics.types.Label(t.Type)).Inc()
	d := events.TrustDecision{Score: l.v.Score, Outcomes: l.v.Outcomes, Threshold: l.v.Threshold,
		Cause: events.CauseUnproven, Reason: fmt.Sprintf("waiting for the canaries of %s", t.Type)}
	outs, err = s.park(l.b, events.HoldCanary, d, l.sealed)
	return outs, true, err
}

// decideCause decides why the pass may go (l.d.Cause), or stops it: over
// its daily budget (blocked), below its threshold (held, unless it goes as
// a probe), held past its hold time (to a human). done reports a stop.
func (s *Service) decideCause(ctx context.Context, l *look, spent trust.Spend) (outs []services.Out, done bool, err error) {
	t, b := l.b.Task, l.b
	overBudget := l.pol.DailyBudget.Exceeded(spent.Tokens, spent.Cost)
	if overBudget && b.Run.Reviewed {
		// A human's requeue is let past a spent budget for its own pass —
		// the human asked for that call — not for the retries of the round
		// it starts: they would spend past the cap on their own.
		requeue, err := s.requeuePass(ctx, b)
		if err != nil {
			return nil, true, err
		}
		overBudget = !requeue
	}
	switch {
	case overBudget:
		l.d.Blocked, l.d.Cause = true, events.CauseBudget
		l.d.Reason = fmt.Sprintf("Blocked: %s budget: spent %d tokens and $%.4f today, over its daily budget", t.Type, spent.Tokens, spent.Cost)
		outs, err = s.block(ctx, b, l.d, l.release)
		return outs, true, err
	case b.Run.Reviewed:
		l.d.Cause, l.d.Reason = events.CauseReviewed, "requeued by a human reviewer"
		outs, err = s.admit(ctx, b, l.d, l.sealed)
		return outs, true, err
	case l.d.Exempt:
		l.d.Cause = events.CauseExempt
	case b.Run.Probe:
		l.d.Cause = events.CauseProbe // a probe's retries go on: it re-measures the type
	case l.v.Below:
		// Held, not handed to a human: the type may recover (a probe
		// succeeds, the score climbs back) and take its held tasks back.
		if ended, err := s.endedByHuman(ctx, b); ended || err != nil {
			return nil, true, err
		}
		gateKey := services.MsgID(t.ID, b.Run.Pass, "gate")
		probe, err := s.probe(ctx, b, l.scoring, l.held, gateKey, l.stats.Outcomes)
		if err != nil {
			return nil, true, err
		}
		if !probe {
			l.d.Cause, l.d.Reason = events.CauseTrust, l.v.Reason
			if l.held != nil && l.held.Hold == events.HoldTrust && b.At.Sub(l.held.At) >= l.scoring.HoldTime {
				l.d.Blocked = true
				l.d.Reason = fmt.Sprintf("%s; held %s without recovering", l.v.Reason, l.scoring.HoldTime)
				outs, err = s.block(ctx, b, l.d, l.release)
				return outs, true, err
			}
			outs, err = s.hold(ctx, l.m, l.scoring, b, l.d, l.sealed, l.held, l.release)
			return outs, true, err
		}
		l.d.Probe, l.d.Cause, l.b.Run.Probe = true, events.CauseProbe, true
		s.log.Info("exploration probe let through", "task", t.ID, "type", t.Type, "score", l.v.Score, "held", l.held != nil)
	case l.v.Unproven && l.scoring.Threshold >= 0:
		l.d.Cause = events.CauseUnproven
	default:
		l.d.Cause = events.CauseTrusted
		if step, below := trust.StreakStep(l.d.Cause, false, b.Run.Attempt, false); step && l.stats.BlockStreak > 0 { // the type recovered: the block streak ends
			if _, _, err := s.cfg.Trust.GateUnder(ctx, l.scoring, t.Type, services.MsgID(t.ID, b.Run.Pass, "gate"), below); err != nil {
				return nil, true, err
			}
		}
	}
	return nil, false, nil
}

// climb applies the rung floor to a retry: it stays on its rung, moves up
// to the next rung whose retries pay (ladder.Skip), or — when none does —
// is handed off (handoff true). It sets l.d's rung figures and reason.
func (s *Service) climb(l *look) (handoff bool) {
	t := l.b.Task
	pool := s.pool()
	explore := services.MsgID(t.ID, l.b.Run.Pass, "explore") // the retry's own rung may be explored
	below := func(rung events.Rung) bool {
		key := ""
		if rung == l.b.Run.Rung {
			key = explore
		}
		low, _, _ := l.scoring.RungBelowWith(l.stats, rung, pool, key)
		return low
	}
	_, tries, successes := l.scoring.RungBelowWith(l.stats, l.b.Run.Rung, pool, explore)
	l.d.RungTries, l.d.RungSuccesses = tries, successes
	measured := fmt.Sprintf("%s retries of %s succeeded %d of %d times, below the floor of %.0f%%",
		l.b.Run.Rung, t.Type, successes, tries, 100*l.scoring.RungFloor)
	if tries < l.scoring.RungMinSamples {
		measured = fmt.Sprintf("%s retries of %s succeeded %d of %d times: too few to judge alone, and with its retries on every rung and %s below the floor of %.0f%%",
			l.b.Run.Rung, t.Type, successes, tries, pooledRungs(pool, t.Type, l.b.Run.Rung), 100*l.scoring.RungFloor)
	}
	switch next := ladder.Skip(l.b.Run.Rung, ladder.ResearchUsed(l.b.Run.DeadEnds), below); next {
	case l.b.Run.Rung:
	case events.RungHandoff:
		l.d.Cause = events.CauseRungRate
		l.d.Reason = fmt.Sprintf("HANDOFF before attempt %d: %s, and so do the rungs above it", l.b.Run.Attempt, measured)
		return true
	default:
		l.d.Rung, l.d.Reason = next, fmt.Sprintf("attempt %d runs on %s: %s", l.b.Run.Attempt, next, measured)
		s.log.Info("retry moved up the ladder", "task", t.ID, "type", t.Type, "from", l.b.Run.Rung, "to", next)
		l.b.Run.Rung = next
	}
	return false
}

// canaries lets a pass of an unproven type through as one of its
// canaries when a place is free (or frees the places of canaries that
// ended), and otherwise makes it wait in the held consumer, up to the
// canary TTL, after which it goes anyway. done reports a wait.
func (s *Service) canaries(ctx context.Context, l *look) (outs []services.Out, done bool, err error) {
	t, b, held := l.b.Task, l.b, l.held
	scoring := s.withCanaries(l.scoring, t.Type)
	if l.quick && b.At.Sub(held.At) < scoring.CanaryTTL && placesTaken(l.stats, scoring, b.At, t.ID) {
		s.metrics.waits.WithLabelValues(s.metrics.types.Label(t.Type)).Inc()
		return nil, true, services.Snooze(canaryDelay(l.m.Delivered, scoring.CanaryTTL), ErrCanaryWait)
	}
	if held == nil { // a held look read the state already (HandleHeld)
		if ended, err := s.endedByHuman(ctx, b); ended || err != nil {
			return nil, true, err
		}
	}
	admit, err := s.cfg.Trust.Canary(ctx, t.Type, t.ID, b.At, scoring, l.stats.Outcomes)
	if err != nil {
		return nil, true, err
	}
	if !admit { // places held by tasks that ended are free
		if freed, err := s.releaseEnded(ctx, t.Type, t.ID); err != nil {
			return nil, true, err
		} else if freed {
			if admit, err = s.cfg.Trust.Canary(ctx, t.Type, t.ID, b.At, scoring, l.stats.Outcomes); err != nil {
				return nil, true, err
			}
		}
	}
	waited := b.At.Sub(l.m.Time) // since it reached the gate's stream position
	if held != nil {
		waited = b.At.Sub(held.At) // since the gate first held it
	}
	switch {
	case admit:
	case waited < scoring.CanaryTTL:
		s.metrics.waits.WithLabelValues(s.metrics.types.Label(t.Type)).Inc()
		if held == nil { // to the held consumer: this one decides the others
			l.d.Cause, l.d.Reason = events.CauseUnproven, fmt.Sprintf("waiting for the canaries of %s", t.Type)
			outs, err = s.park(b, events.HoldCanary, l.d, l.sealed)
			return outs, true, err
		}
		delay := canaryDelay(l.m.Delivered, scoring.CanaryTTL)
		s.log.Debug("waiting for canaries", "task", t.ID, "type", t.Type, "outcomes", l.v.Outcomes, "delay", delay)
		return nil, true, services.Snooze(delay, ErrCanaryWait)
	default:
		l.d.Reason = fmt.Sprintf("waited %s for the canaries of %s: let through", waited.Round(time.Second), t.Type)
	}
	return nil, false, nil
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
