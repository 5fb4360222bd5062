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
//     asleep in the held index, unspent, until a place is free or the
//     canaries' results score the type;
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
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
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
	turn    int // the lane the sweeper's next sweep starts after (sweep)
	// checked is when the sweeper last woke a canary lane's oldest pass
	// to look in full (dueOf); the sweeper's goroutine only.
	checked map[lane]time.Time
	// unbounded: the sweeper could not read the backlog before the model
	// (room); full: the backlog was full at its last read.
	unbounded, full atomic.Bool
	recent          *admissions // the latest admissions by type (crowded)
}

// New checks cfg and returns the gate.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, log: cfg.Log.With("service", "gate"), recent: newAdmissions(ShareWindow)}
	s.metrics = newMetrics(cfg, s)
	return s, nil
}

// Spec is the gate's consumer: verified tasks.
func (s *Service) Spec() services.Spec {
	return services.Spec{Name: services.ConsumerGate, Filters: []string{events.StageFilter(events.StageVerified)},
		Handler: s.Handle, Concurrency: 8, Prefetch: services.FastPrefetch, MaxDeliver: MaxDeliver}
}

// HeldSpec is the gate's second consumer: the passes it holds back — for
// their type's trust, or waiting for its canaries — as held events, so the
// verified consumer goes on deciding every other type's passes. A held
// pass does not wait here either: its first look acks it and leaves it
// asleep in the held index (Config.Held), which the sweeper wakes — so
// however many passes are held, and for however long, none takes a
// pending slot. (Without a held index, a held pass is snoozed here.)
func (s *Service) HeldSpec() services.Spec {
	return services.Spec{Name: services.ConsumerGateHeld, Filters: []string{events.StageFilter(events.StageHeld)},
		Handler: s.HandleHeld, Concurrency: 8, Prefetch: services.FastPrefetch, MaxDeliver: MaxHeldDeliver}
}

// WakeSpec is the gate's third consumer: the wakes of passes asleep in
// the held index, looked at as HandleHeld looks at a held pass. Wakes
// have a consumer of their own, so a burst of held events of a new type
// in gate_held never delays a held type's re-admission, probe or
// hand-off. The sweeper (Sweep) runs beside it; without a held index
// it has nothing to consume.
func (s *Service) WakeSpec() services.Spec {
	spec := services.Spec{Name: services.ConsumerGateWake, Filters: []string{events.StageFilter(events.StageWake)},
		Handler: s.HandleHeld, Concurrency: 32, Prefetch: services.FastPrefetch, MaxDeliver: MaxHeldDeliver}
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
	return s.decide(ctx, m, ev.Base, ev.Sealed, nil, nil)
}

// decide is the gate's decision on a pass, verified (held nil) or held:
// it reads what the decision needs — the type's evidence from the view
// (synced when an outcome or two could change the decision), its spend,
// its state when an earlier delivery may have stopped it — and lets
// task.Decide decide, taking the claims it asks for (a probe, a trial or
// canary place: compare-and-set writes of the type's gate facts); then it
// writes and emits what was decided.
//
// read is the task's state when the caller has just read it (a held
// look), nil when decide reads it where it must.
func (s *Service) decide(ctx context.Context, m *services.Msg, b events.Base, sealed *events.Sealed, held *events.Held, read *stateRead) ([]services.Out, error) {
	snap := s.cfg.Policy.Snapshot()
	b.At, b.By, b.PolicyRev = s.cfg.Now().UTC(), s.cfg.Instance, snap.Rev
	t := b.Task
	pol := snap.For(t.Type)
	in := task.GateIn{Task: t, Run: b.Run, Arrived: m.Time, Delivered: m.Delivered, Now: b.At,
		Exempt: pol.IsExempt(), Claimed: map[task.Claim]bool{}}
	if held != nil {
		in.Hold, in.Since = held.Hold, held.At
		// A pass the sweeper woke from the held index looks in full: its
		// wake means the sweeper saw a reason it may go.
		in.Woken = s.cfg.Held != nil && isWake(m)
	}
	in.Crowded = s.crowded(t.Type, b.At)
	in.Scoring = pol.Scoring(s.cfg.Scoring).WithDefaults()
	in.Scoring.Exempt = []string{} // the policy says which types are exempt
	s.evaluate(&in)
	out := task.Decide(in)
	if out.Quick { // a flood's pass parked, or a look that waits on: nothing read
		return s.act(ctx, m, b, sealed, held, in, out, "")
	}
	// A redelivered pass that an earlier delivery stopped stays stopped (a
	// human's requeue too: the daily budget may have stopped it), settled
	// from the task's state alone: nothing else the decision reads — a
	// View that lags behind the outcomes, the spend counters — keeps its
	// record from being published again.
	if m.Delivered > 1 || held != nil {
		d := events.TrustDecision{Score: in.Verdict.Score, Outcomes: in.Verdict.Outcomes, Threshold: in.Verdict.Threshold, Exempt: in.Exempt}
		if outs, ok, err := s.stopped(ctx, b, d, read); ok || err != nil {
			return outs, err
		}
	}
	// A look at a pass waiting for canaries reads only what its claim
	// needs: the view, not the server — one in FullLookEvery syncs.
	quickLook := held != nil && held.Hold.ForOutcomes() && !in.Woken && m.Delivered%FullLookEvery != 0
	if !quickLook && mayHinge(b.Run, in.Verdict, in.Scoring, in.Exempt) {
		// Every outcome of the type stored before this pass reached the
		// gate must count — a retry's own previous one, those a client saw
		// end before it submitted this task — and the view may not have
		// received the newest yet: one small read makes sure.
		if err := s.cfg.View.Sync(ctx, t.Type); err != nil {
			return nil, err
		}
		s.evaluate(&in)
	}
	if pol.DailyBudget != nil {
		if s.cfg.Spending == nil {
			return nil, fmt.Errorf("gate: type %s has a daily budget but the gate has no spend counters", t.Type)
		}
		var err error
		if in.Spent, err = s.cfg.Spending.On(ctx, t.Type, b.At); err != nil {
			return nil, err
		}
		if in.OverBudget = pol.DailyBudget.Exceeded(in.Spent.Tokens, in.Spent.Cost); in.OverBudget && b.Run.Reviewed {
			// A human's requeue is let past a spent budget for its own pass —
			// the human asked for that call — not for the retries of the round
			// it starts: they would spend past the cap on their own.
			requeue, err := s.requeuePass(ctx, b)
			if err != nil {
				return nil, err
			}
			in.OverBudget = !requeue
		}
	}
	// A canary, or a retry measuring a rung, that the gate stops gives up
	// its place.
	release := ""
	if in.Stats.Holds(t.ID) {
		release = t.ID
	}
	for out = task.Decide(in); out.Act == task.ActAsk; out = task.Decide(in) {
		granted, ended, err := s.claim(ctx, out.Ask, b, out.Run.Rung, in, held)
		if ended || err != nil {
			return nil, err // a human ended the task: it takes nothing
		}
		in.Claimed[out.Ask] = granted
	}
	out.Trust.Shadow = s.shadow(in) // recorded with the decision, never enforced
	return s.act(ctx, m, b, sealed, held, in, out, release)
}

// evaluate reads the type's evidence from the view and scores it (a retry
// on its settled tasks only), with its number of canaries resolved from
// the mesh's pooled evidence.
func (s *Service) evaluate(in *task.GateIn) {
	t := in.Task
	in.Pool = s.pool()
	prior := in.Scoring.PriorOf(in.Pool, t.Type)
	in.Scoring.Canary = in.Scoring.CanariesWith(prior)
	in.Stats = s.cfg.View.Stats(t.Type)
	in.Verdict = in.Scoring.EvaluateWith(t.Type, in.Stats, prior, in.Run.Attempt > 1)
}

// claim takes what the decision asked for of the type's gate facts (for
// ClaimRung, a place on rung) and reports whether it was granted. A task a
// human ended takes nothing (ended): the verified pass's state is read
// first.
func (s *Service) claim(ctx context.Context, c task.Claim, b events.Base, rung events.Rung, in task.GateIn, held *events.Held) (granted, ended bool, err error) {
	t := b.Task
	place := c == task.ClaimCanary || c == task.ClaimRung
	if c != task.ClaimTrial && (!place || held == nil) { // a held look read the state already (HandleHeld)
		if ended, err := s.endedByHuman(ctx, b); ended || err != nil {
			return false, ended, err
		}
	}
	switch c {
	case task.ClaimStreak:
		probe, streak, err := s.cfg.Trust.GateUnder(ctx, in.Scoring, t.Type, services.MsgID(t.ID, b.Run.Pass, "gate"), true)
		if err == nil && !probe {
			s.log.Info("task held", "task", t.ID, "type", t.Type, "pass", b.Run.Pass, "streak", streak)
		}
		return probe, false, err
	case task.ClaimProbe:
		probe, err := s.cfg.Trust.HeldProbe(ctx, in.Scoring, t.Type, b.At, in.Stats)
		return probe, false, err
	case task.ClaimTrial:
		places := in.Scoring.TrialPlaces(in.Stats)
		ok, err := s.placeFreeing(ctx, t, func() (bool, error) {
			return s.cfg.Trust.Trial(ctx, t.Type, t.ID, b.At, in.Scoring, places)
		})
		return ok, false, err
	case task.ClaimCanary:
		ok, err := s.placeFreeing(ctx, t, func() (bool, error) {
			return s.cfg.Trust.Canary(ctx, t.Type, t.ID, b.At, in.Scoring, in.Stats)
		})
		return ok, false, err
	case task.ClaimRung:
		ok, err := s.placeFreeing(ctx, t, func() (bool, error) {
			return s.cfg.Trust.Rung(ctx, t.Type, t.ID, b.Run.Pass, rung, b.At, in.Scoring, in.Stats)
		})
		return ok, false, err
	}
	return false, false, fmt.Errorf("gate: unknown claim %q", c)
}

// act does what the gate decided with the pass: writes the task's state
// when the gate stops it, and emits where the pass goes next.
func (s *Service) act(ctx context.Context, m *services.Msg, b events.Base, sealed *events.Sealed, held *events.Held, in task.GateIn, out task.GateOut, release string) ([]services.Out, error) {
	t, d := b.Task, out.Trust
	if out.ResetStreak { // the type recovered: the block streak ends
		if _, _, err := s.cfg.Trust.GateUnder(ctx, in.Scoring, t.Type, services.MsgID(t.ID, b.Run.Pass, "gate"), false); err != nil {
			return nil, err
		}
	}
	if out.Run.Probe && !b.Run.Probe {
		s.log.Info("exploration probe let through", "task", t.ID, "type", t.Type, "score", d.Score, "held", held != nil)
	}
	if out.Run.Rung != b.Run.Rung {
		s.log.Info("retry moved up the ladder", "task", t.ID, "type", t.Type, "from", b.Run.Rung, "to", out.Run.Rung)
	}
	b.Run = out.Run
	switch out.Act {
	case task.ActAdmit:
		s.recent.add(t.Type, b.At)
		return s.admit(ctx, b, d, sealed)
	case task.ActHold:
		return s.hold(ctx, m, in.Scoring, b, d, sealed, held, release)
	case task.ActSleep:
		return nil, s.sleep(ctx, m, in.Scoring, held, events.HoldTrust, "")
	case task.ActPark:
		if out.Hold.ForOutcomes() {
			s.metrics.waits.WithLabelValues(s.metrics.types.Label(t.Type)).Inc()
		}
		return s.park(b, out.Hold, d, sealed)
	case task.ActWait:
		if out.Hold.ForOutcomes() {
			s.metrics.waits.WithLabelValues(s.metrics.types.Label(t.Type)).Inc()
		}
		s.log.Debug("waiting", "task", t.ID, "type", t.Type, "for", out.Hold, "outcomes", in.Verdict.Outcomes)
		return nil, s.sleep(ctx, m, in.Scoring, held, out.Hold, out.Run.Rung)
	case task.ActBlock:
		return s.block(ctx, b, d, release)
	case task.ActHandoff:
		return s.handoff(ctx, b, d, release)
	}
	return nil, fmt.Errorf("gate: unknown decision %q", out.Act)
}

// FullLookEvery: one look in this many at a pass waiting for canaries
// reads the server whatever the view shows (task.FullLookEvery).
const FullLookEvery = task.FullLookEvery

// pool is the mesh's pooled evidence, every type's window as the
// mesh-wide scoring takes it (a type's own window may differ: the pool is
// what the mesh knows, the same for every type).
func (s *Service) pool() *trust.Pool { return s.cfg.View.Pool(s.cfg.Scoring) }

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

// releaseEnded gives up the canary and rung places of taskType held by
// tasks that have ended — with their outcomes recorded, or cancelled or
// resolved by a human — and the rung places of retries whose task went on
// to a later pass, and reports whether it freed any. A canary's place is given back
// here, by the next pass that asks for one, not by whoever ended it: the
// recorder writes no gate facts. It reads the holders' states only when a
// pass is refused a place, one read per task holding a place.
func (s *Service) releaseEnded(ctx context.Context, taskType, self string) (bool, error) {
	if s.cfg.Tasks == nil {
		return false, nil
	}
	stats, err := s.cfg.Trust.Get(ctx, taskType)
	if err != nil {
		return false, err
	}
	freed, seen := false, map[string]bool{self: true}
	for _, c := range slices.Concat(stats.Canaries, stats.Rungs) {
		if seen[c.Key] {
			continue
		}
		seen[c.Key] = true
		st, err := s.cfg.Tasks.Get(ctx, c.Key)
		if errors.Is(err, services.ErrTaskNotFound) {
			continue
		}
		if err != nil {
			return false, err
		}
		switch {
		case events.Terminal(st.Status):
			if _, err := s.cfg.Trust.Release(ctx, taskType, c.Key); err != nil {
				return false, err
			}
			s.log.Info("canary place of an ended task released", "type", taskType, "task", c.Key, "status", st.Status)
		case staleRung(stats, c.Key, st.Pass):
			// Its retry recorded no outcome that counts (refused, a
			// deployment fault) and the task went on: that place is over.
			if _, err := s.cfg.Trust.ReleaseBefore(ctx, taskType, c.Key, st.Pass); err != nil {
				return false, err
			}
			s.log.Info("rung place of a retry that moved on released", "type", taskType, "task", c.Key, "pass", st.Pass)
		default:
			continue
		}
		freed = true
	}
	return freed, nil
}

// staleRung reports whether task key holds a rung place for a pass before
// pass (what trust.ReleaseBefore gives up).
func staleRung(s trust.Stats, key string, pass int) bool {
	_, stale := trust.ReleaseBefore(s, key, pass)
	return stale
}

// placeFreeing asks for a place (a trial, canary or rung place of task
// t's type) with ask; refused, it frees the places of tasks that ended
// (releaseEnded) and, when it freed any, asks once more.
func (s *Service) placeFreeing(ctx context.Context, t events.Task, ask func() (bool, error)) (bool, error) {
	ok, err := ask()
	if ok || err != nil {
		return ok, err
	}
	if freed, err := s.releaseEnded(ctx, t.Type, t.ID); err != nil || !freed {
		return false, err
	}
	return ask()
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
	s.decided(ctx, b, d, task.ActAdmit)
	out, err := services.Next(b, events.StageAdmitted, events.EventAdmitted, events.Admitted{Base: b, Trust: d, Sealed: sealed})
	return []services.Out{out}, err
}

// block files the task for human review with status needs_human_review,
// with what was tried when a retry is stopped.
func (s *Service) block(ctx context.Context, b events.Base, d events.TrustDecision, release string) ([]services.Out, error) {
	if err := s.release(ctx, b.Task.Type, release); err != nil {
		return nil, err
	}
	s.decided(ctx, b, d, task.ActBlock)
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
	s.decided(ctx, b, d, task.ActHandoff)
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
func (s *Service) decided(ctx context.Context, b events.Base, d events.TrustDecision, act task.GateAct) {
	services.OnStored(ctx, func() {
		s.metrics.decisions.WithLabelValues(s.metrics.types.Label(b.Task.Type), string(d.Cause)).Inc()
		s.metrics.shadow.Count(b.Task.Type, act.Kind(), d.Shadow)
	})
}

// release gives up the canary place of a task the gate stops.
func (s *Service) release(ctx context.Context, taskType, id string) error {
	if id == "" {
		return nil
	}
	_, err := s.cfg.Trust.Release(ctx, taskType, id)
	return err
}
