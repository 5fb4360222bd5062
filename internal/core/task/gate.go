package task

import (
	"fmt"
	"slices"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

// GateIn is what the trust gate knows when it decides a pass (SPEC §4):
// the pass, its type's evidence as the gate's view holds it, the type's
// policy, the clock — and the answers to the claims the decision asked
// for (GateOut.Ask): a claim takes something of the type's gate facts (a
// probe, a trial place, a canary place) under compare-and-set, which only
// the gate can do. Decide reads nothing else.
type GateIn struct {
	Task events.Task
	Run  events.Run
	// Hold is the hold of a pass the gate held back ("" for a verified
	// pass), Since when it first held it.
	Hold  events.Hold
	Since time.Time
	// Arrived is when the pass reached the gate's stream position;
	// Delivered its delivery count there.
	Arrived   time.Time
	Delivered int
	// Crowded: the queue before the model is full and the type had more
	// than its share of the gate's latest admissions — a trusted first
	// pass then waits its turn (queued) instead of joining that queue.
	Crowded bool
	// Woken: the look is at a held pass the gate's sweeper woke from the
	// held index, because it saw a reason it may go: the look is a full
	// one, never Quick.
	Woken bool
	Now   time.Time
	// Exempt: the type's policy exempts it; OverBudget: its daily budget
	// is spent (and the pass is not a human's requeue let past it), Spent
	// what it spent today.
	Exempt, OverBudget bool
	Spent              scoring.Spend
	// Scoring is the type's policy; Canary its number of canaries for
	// this type (resolved with the pooled prior).
	Scoring scoring.Policy
	Verdict scoring.Verdict
	Stats   scoring.Stats
	Pool    *scoring.Pool
	// Claimed holds the answers to the claims asked so far.
	Claimed map[Claim]bool
}

// Claim is something of the type's gate facts a decision takes.
type Claim string

const (
	ClaimNone   Claim = ""
	ClaimStreak Claim = "streak" // a step of the block streak: granted, the pass goes as its probe
	ClaimProbe  Claim = "probe"  // a held pass's probe (scoring.Policy.HeldProbe)
	ClaimTrial  Claim = "trial"  // a trial place while the type is on probation
	ClaimCanary Claim = "canary" // a canary place while the type is unproven
	ClaimRung   Claim = "rung"   // a place on a rung its type has too few retries measured on
)

// GateAct is what the gate does with the pass.
type GateAct string

const (
	ActAsk     GateAct = "ask"     // take Ask first, then decide again
	ActAdmit   GateAct = "admit"   // to the prompt builder
	ActHold    GateAct = "hold"    // held for its type's trust (status held)
	ActSleep   GateAct = "sleep"   // a held pass stays held (refused a trial place)
	ActPark    GateAct = "park"    // to the held consumer, waiting (GateOut.Hold: for its type's canaries, a rung's, or its turn)
	ActWait    GateAct = "wait"    // a look at a waiting pass: wait on (GateOut.Hold)
	ActBlock   GateAct = "block"   // to a human (needs_human_review)
	ActHandoff GateAct = "handoff" // the ladder ends here (blocked, rung_rate)
)

// GateOut is the gate's decision on a pass.
type GateOut struct {
	Act GateAct
	// Ask is the claim to take when Act is ActAsk.
	Ask Claim
	// Trust is the decision as recorded: cause, reason, score, probe, rung.
	Trust events.TrustDecision
	// Run is the pass as it goes on: moved up the ladder, or a probe.
	Run events.Run
	// ResetStreak: the type recovered, its block streak ends (a write
	// whose answer changes nothing here).
	ResetStreak bool
	// Quick: the decision read nothing the view does not hold (a look at
	// a pass that waits while every canary place is taken).
	Quick bool
	// Hold is what a parked or waiting pass waits for: its type's
	// canaries (events.HoldCanary), the retries measuring its rung
	// (events.HoldRung) or its turn (events.HoldQueued).
	Hold events.Hold
}

// FullLookEvery: one look in this many at a pass waiting for canaries
// makes the full look (asks for a place, which frees those of canaries
// that ended) whatever the view shows.
const FullLookEvery = 8

// Decide is the gate's decision on a pass: the one place its rules live.
// It decides why the pass may go (its cause) or stops it — over budget,
// below its threshold (held, unless it goes as a probe), held past its
// hold time; moves a retry up the ladder or hands it off (the rung
// floor); lets a pass of an unproven type through as a canary or makes it
// wait. Where a rule takes something of the type's gate facts, it asks
// (ActAsk) and decides again with the answer.
func Decide(in GateIn) GateOut {
	out := decide(in)
	if in.Hold == events.HoldTrust && out.Act == ActAdmit {
		out.Run.Readmitted = true // it and its retries measure the held backlog
	}
	// The block streak ends only with a trusted pass that goes on, as
	// rebuild replays it (scoring.StreakStep): not with one the backlog's
	// rules put back to sleep or let through as a probe, nor with a retry
	// parked for its rung (its look may still hand it off).
	goes := out.Act == ActAdmit || out.Act == ActPark && out.Hold != events.HoldRung
	out.ResetStreak = in.Stats.BlockStreak > 0 && out.Trust.Cause == events.CauseTrusted && goes
	return out
}

// gated reports whether the type's trust may stop the pass: the type is
// not exempt and its threshold is not switched off (negative).
func (in *GateIn) gated() bool { return !in.Exempt && in.Scoring.Threshold >= 0 }

func decide(in GateIn) GateOut {
	t := in.Task
	v := in.Verdict
	out := GateOut{Run: in.Run, Trust: events.TrustDecision{Score: v.Score, Outcomes: v.Outcomes, Threshold: v.Threshold, Exempt: in.Exempt}}
	canaryRound := v.Unproven && in.gated()
	// A flood of a new type: a verified pass that arrives while the view
	// shows every canary place taken is parked at once.
	if in.Hold == "" && in.Delivered == 1 && canaryRound && !in.Run.Probe && !in.Run.Reviewed && !v.Below &&
		in.Run.Pass == 1 && in.Run.Attempt <= 1 && in.Now.Sub(in.Arrived) < in.Scoring.CanaryTTL && PlacesTaken(in.Stats, in.Scoring, in.Now, t.ID) {
		return waiting(out, ActPark, t, true)
	}
	// A pass queued for its turn waits until the gate's sweeper wakes it
	// (its first look, at its held event, leaves it asleep).
	if in.Hold == events.HoldQueued && !in.Woken {
		return queued(out, ActWait, t)
	}
	held := in.Hold == events.HoldTrust
	switch {
	case in.OverBudget:
		out.Trust.Blocked, out.Trust.Cause = true, events.CauseBudget
		out.Trust.Reason = fmt.Sprintf("Blocked: %s budget: spent %d tokens and $%.4f today, over its daily budget", t.Type, in.Spent.Tokens, in.Spent.Cost)
		return act(out, ActBlock)
	case in.Run.Reviewed:
		out.Trust.Cause, out.Trust.Reason = events.CauseReviewed, "requeued by a human reviewer"
		return act(out, ActAdmit)
	case in.Exempt:
		out.Trust.Cause = events.CauseExempt
	case in.Run.Probe:
		out.Trust.Cause = events.CauseProbe // a probe's retries go on: it re-measures the type
	case v.Below:
		claim := ClaimStreak
		if held {
			claim = ClaimProbe
		} else if step, _ := scoring.StreakStep(events.CauseTrust, false, in.Run.Attempt, false); !step {
			claim = ClaimNone // a retry takes no step: held
		}
		probe, asked := in.Claimed[claim]
		if claim != ClaimNone && !asked {
			return ask(out, claim)
		}
		if !probe {
			out.Trust.Cause, out.Trust.Reason = events.CauseTrust, v.Reason
			if held && in.Now.Sub(in.Since) >= in.Scoring.HoldTime {
				out.Trust.Blocked = true
				out.Trust.Reason = fmt.Sprintf("%s; held %s without recovering", v.Reason, in.Scoring.HoldTime)
				return act(out, ActBlock)
			}
			return act(out, ActHold)
		}
		out.Trust.Probe, out.Trust.Cause, out.Run.Probe = true, events.CauseProbe, true
	case v.Unproven && in.Scoring.Threshold >= 0:
		out.Trust.Cause = events.CauseUnproven
	default:
		out.Trust.Cause = events.CauseTrusted // the type recovered: its block streak ends (Decide)
	}
	out, backlog, done := readmit(out, in)
	if done {
		return out
	}
	if in.Run.Readmitted && !in.Run.Probe && in.Run.Attempt > 1 && in.gated() && backlog.HandsOff() {
		// A held task re-admitted after its type recovered failed again,
		// as the last re-admitted did: hard on its own, not for its type.
		out.Trust.Cause = events.CauseRungRate
		out.Trust.Reason = fmt.Sprintf("HANDOFF before attempt %d: the last %d held tasks of %s re-admitted ended failed, while its new tasks do not", in.Run.Attempt, backlog.Ended, t.Type)
		return act(out, ActHandoff)
	}
	retry := in.Run.Attempt > 1 && in.Run.Rung != ""
	if retry && climb(&out, in) {
		return act(out, ActHandoff)
	}
	if canaryRound && !out.Run.Probe {
		if out = canaries(out, in); out.Act != ActAdmit {
			return out
		}
	}
	// A retry waits for its rung's first retries only while no other hold
	// holds it: a pass held for its type's trust, its canaries or its turn
	// goes on when that hold ends (one held event per hold of a pass).
	if retry && !out.Run.Probe && in.gated() && (in.Hold == "" || in.Hold == events.HoldRung) && in.Scoring.RungThin(in.Stats, out.Run.Rung) {
		var stop bool
		if out, stop = rungCanary(out, in); stop {
			return out
		}
	}
	if in.Crowded && in.Hold == "" && out.Trust.Cause == events.CauseTrusted && in.Run.Attempt <= 1 {
		// A flood of a trusted type takes its turn with every other type's
		// passes instead of filling the queue before the model.
		return queued(out, ActPark, t)
	}
	return act(out, ActAdmit)
}

// readmit paces the re-admission of a held pass (and reads the held
// backlog a re-admitted pass's retry is judged by): while re-admitted
// held tasks of the type fail, the few places left go to the newest held
// at the probe pace; while the backlog has not proved itself, a few at a
// time (ClaimTrial). done says the pass stops here, with out its decision.
func readmit(out GateOut, in GateIn) (_ GateOut, backlog scoring.Backlog, done bool) {
	t, v := in.Task, in.Verdict
	held := in.Hold == events.HoldTrust
	if held || in.Run.Readmitted { // not read on every pass
		backlog = in.Scoring.BacklogOf(in.Stats)
	}
	gated := in.gated()
	expired := held && in.Now.Sub(in.Since) >= in.Scoring.HoldTime
	paced := false // re-admitted at the held-probe pace
	if held && gated && backlog.Doubt() && !out.Run.Probe {
		// Re-admitted held tasks of the type fail while its new tasks do
		// not: the few places left go to the newest held, not to one past
		// its hold time.
		if expired {
			out.Trust.Blocked, out.Trust.Cause = true, events.CauseTrust
			out.Trust.Reason = fmt.Sprintf("held %s: the last held tasks of %s re-admitted failed", in.Scoring.HoldTime, t.Type)
			return act(out, ActBlock), backlog, true
		}
		if backlog.Paused() {
			ok, asked := in.Claimed[ClaimProbe]
			if !asked {
				return ask(out, ClaimProbe), backlog, true
			}
			if !ok {
				out.Trust.Cause = events.CauseTrust
				out.Trust.Reason = fmt.Sprintf("held: the last %d held tasks of %s re-admitted failed; the rest come back at the probe pace", backlog.Losses, t.Type)
				return act(out, ActSleep), backlog, true
			}
			paced = true
			out.Trust.Reason = fmt.Sprintf("re-admitted at the probe pace: the last %d held tasks of %s re-admitted failed", backlog.Losses, t.Type)
		}
	}
	if held && gated && !paced && in.Scoring.ReadmitLimited(backlog, v.Probation) && !out.Run.Probe {
		// Re-admitted on a probe's word alone, or while the held backlog
		// has not proved itself: a few at a time, more with every
		// re-admitted success (a slow start); one at a time while the
		// newest re-admitted held task failed.
		ok, asked := in.Claimed[ClaimTrial]
		if !asked {
			return ask(out, ClaimTrial), backlog, true
		}
		if !ok && expired {
			out.Trust.Blocked, out.Trust.Cause = true, events.CauseTrust
			out.Trust.Reason = fmt.Sprintf("re-admitted a few at a time while %s's held tasks prove themselves, and held %s without a place", t.Type, in.Scoring.HoldTime)
			return act(out, ActBlock), backlog, true
		}
		if !ok {
			return act(out, ActSleep), backlog, true
		}
		switch {
		case backlog.Doubt():
			out.Trust.Reason = fmt.Sprintf("re-admitted one at a time: the last held task of %s re-admitted failed", t.Type)
		case v.Probation:
			out.Trust.Reason = fmt.Sprintf("re-admitted: a probe of %s succeeded (%d at a time until its score recovers)", t.Type, in.Scoring.TrialPlaces(in.Stats))
		default:
			out.Trust.Reason = fmt.Sprintf("re-admitted: %s recovered (%d held tasks at a time until %d re-admitted succeed in a row)", t.Type, in.Scoring.TrialPlaces(in.Stats), in.Scoring.MinOutcomes)
		}
	}
	return out, backlog, false
}

func queued(out GateOut, a GateAct, t events.Task) GateOut {
	out.Trust.Reason = fmt.Sprintf("waiting its turn: the queue before the model is full and %s had more than its share of it", t.Type)
	out.Hold, out.Quick = events.HoldQueued, a == ActWait
	return act(out, a)
}

// climb applies the rung floor to a retry: it stays on its rung, moves up
// to the next rung whose retries pay (ladder.Skip), or — when none does —
// is handed off (true).
func climb(out *GateOut, in GateIn) (handoff bool) {
	t, p, run := in.Task, in.Scoring, out.Run
	explore := events.MsgID(t.ID, run.Pass, "explore") // the retry's own rung may be explored
	below := func(rung events.Rung) bool {
		key := ""
		if rung == run.Rung {
			key = explore
		}
		low, _, _ := p.RungBelowWith(in.Stats, rung, in.Pool, key)
		return low
	}
	_, tries, successes := p.RungBelowWith(in.Stats, run.Rung, in.Pool, explore)
	out.Trust.RungTries, out.Trust.RungSuccesses = tries, successes
	measured := fmt.Sprintf("%s retries of %s succeeded %d of %d times, below the floor of %.0f%%",
		run.Rung, t.Type, successes, tries, 100*p.RungFloor)
	if tries < p.RungMinSamples {
		measured = fmt.Sprintf("%s retries of %s succeeded %d of %d times: too few to judge alone, and with its retries on every rung and %s below the floor of %.0f%%",
			run.Rung, t.Type, successes, tries, pooledRungs(in.Pool, t.Type, run.Rung), 100*p.RungFloor)
	}
	switch next := ladder.Skip(run.Rung, ladder.ResearchUsed(run.DeadEnds), below); next {
	case run.Rung:
	case events.RungHandoff:
		out.Trust.Cause = events.CauseRungRate
		out.Trust.Reason = fmt.Sprintf("HANDOFF before attempt %d: %s, and so do the rungs above it", run.Attempt, measured)
		return true
	default:
		out.Trust.Rung, out.Trust.Reason = next, fmt.Sprintf("attempt %d runs on %s: %s", run.Attempt, next, measured)
		out.Run.Rung = next
	}
	return false
}

// pooledRungs says what the other types' retries on rung tell.
func pooledRungs(pool *scoring.Pool, taskType string, rung events.Rung) string {
	mean, types := pool.Rung(taskType, rung)
	if types < 2 {
		return "nothing pooled from other types"
	}
	return fmt.Sprintf("%.0f%% for %d other types", 100*mean, types)
}

// canaries lets a pass of an unproven type through as one of its canaries
// when it gets a place; otherwise it waits (parked, or looked at again) up
// to the canary TTL, after which it goes anyway.
func canaries(out GateOut, in GateIn) GateOut {
	t := in.Task
	waited := in.Now.Sub(in.Arrived) // since it reached the gate's stream position
	if in.Hold != "" {
		waited = in.Now.Sub(in.Since) // since the gate first held it
	}
	// Most looks at a waiting pass find every place still taken: they ask
	// for nothing (Quick); one in FullLookEvery asks whatever the view shows.
	if in.Hold == events.HoldCanary && !in.Woken && in.Delivered%FullLookEvery != 0 && waited < in.Scoring.CanaryTTL && PlacesTaken(in.Stats, in.Scoring, in.Now, t.ID) {
		return waiting(out, ActWait, t, true)
	}
	admit, asked := in.Claimed[ClaimCanary]
	switch {
	case !asked:
		return ask(out, ClaimCanary)
	case admit:
	case waited < in.Scoring.CanaryTTL && in.Hold == "":
		return waiting(out, ActPark, t, false) // to the held consumer: this one decides the others
	case waited < in.Scoring.CanaryTTL:
		return waiting(out, ActWait, t, false)
	default:
		out.Trust.Reason = fmt.Sprintf("waited %s for the canaries of %s: let through", waited.Round(time.Second), t.Type)
	}
	return act(out, ActAdmit)
}

// rungCanary lets a retry climb onto a rung its type has too few retries
// measured on (scoring.Policy.RungThin) when it gets one of the rung's
// places; otherwise it waits (parked, or looked at again) for the
// outcomes of the retries holding them, up to the canary TTL, after
// which it goes anyway. stop is false when the retry goes on.
func rungCanary(out GateOut, in GateIn) (_ GateOut, stop bool) {
	t, p, rung := in.Task, in.Scoring, out.Run.Rung
	waited := in.Now.Sub(in.Arrived)
	if in.Hold == events.HoldRung {
		waited = in.Now.Sub(in.Since)
	}
	if in.Hold == events.HoldRung && !in.Woken && in.Delivered%FullLookEvery != 0 && waited < p.CanaryTTL && p.RungPlaces(in.Stats, rung, in.Now, t.ID) >= p.RungCanary {
		return rungWait(out, ActWait, t, rung, true), true
	}
	admit, asked := in.Claimed[ClaimRung]
	switch {
	case !asked:
		return ask(out, ClaimRung), true
	case admit:
		return out, false
	case waited < p.CanaryTTL && in.Hold != events.HoldRung:
		return rungWait(out, ActPark, t, rung, false), true
	case waited < p.CanaryTTL:
		return rungWait(out, ActWait, t, rung, false), true
	}
	out.Trust.Reason = fmt.Sprintf("waited %s for the %s retries of %s being measured: let through", waited.Round(time.Second), rung, t.Type)
	return out, false
}

func rungWait(out GateOut, a GateAct, t events.Task, rung events.Rung, quick bool) GateOut {
	out.Trust.Reason = fmt.Sprintf("waiting for the %s retries of %s being measured", rung, t.Type)
	out.Quick, out.Hold = quick, events.HoldRung
	return act(out, a)
}

func waiting(out GateOut, a GateAct, t events.Task, quick bool) GateOut {
	out.Trust.Cause, out.Trust.Reason = events.CauseUnproven, fmt.Sprintf("waiting for the canaries of %s", t.Type)
	out.Quick, out.Hold = quick, events.HoldCanary
	return act(out, a)
}

func act(out GateOut, a GateAct) GateOut { out.Act = a; return out }

func ask(out GateOut, c Claim) GateOut { out.Act, out.Ask = ActAsk, c; return out }

// PlacesTaken reports whether the view shows every canary place of the
// type taken by another task still in flight, so asking for one would be
// refused.
func PlacesTaken(stats scoring.Stats, p scoring.Policy, now time.Time, self string) bool {
	return p.Canary >= 0 && LiveHolders(stats, p, now, self) >= p.Canary
}

// LiveHolders counts the canary (or trial) places of the type held by a
// task other than self that is still in flight: its place unexpired, no
// final result among the type's outcomes.
func LiveHolders(stats scoring.Stats, p scoring.Policy, now time.Time, self string) int {
	ended := map[string]bool{}
	for _, r := range stats.Folded() {
		if r.Settled() {
			ended[r.Task] = true
		}
	}
	live := 0
	for _, c := range stats.Canaries {
		if c.Key != self && now.Sub(c.At) < p.CanaryTTL && !ended[c.Key] {
			live++
		}
	}
	return live
}

// Kind is what an act does to the pass's fate: admit (a wait for canaries
// only delays it), hold, block or handoff; "" for ActAsk.
func (a GateAct) Kind() string {
	switch a {
	case ActAdmit, ActPark, ActWait:
		return "admit"
	case ActHold, ActSleep:
		return "hold"
	case ActBlock:
		return "block"
	case ActHandoff:
		return "handoff"
	}
	return ""
}

// ClaimIn answers claim c of task id's pass run (as the decision that
// asked moved it: ClaimRung takes a place on run.Rung) as the trust store's
// compare-and-set would, on gate facts st held in memory: what a replay
// (dispatch whatif) or a shadow policy's decision takes instead of
// writing the type's gate facts. It returns the facts as the claim leaves
// them.
func ClaimIn(c Claim, st scoring.Stats, p scoring.Policy, id string, run events.Run, now time.Time) (scoring.Stats, bool) {
	switch c {
	case ClaimStreak:
		next, probe, _ := p.Gate(st, events.MsgID(id, run.Pass, "gate"), true)
		return next, probe
	case ClaimProbe:
		return p.HeldProbe(st, now)
	case ClaimTrial:
		next, ok, _ := p.AdmitTrial(st, id, now, p.TrialPlaces(st))
		return next, ok
	case ClaimCanary:
		next, ok, _ := p.AdmitCanary(st, id, now)
		return next, ok
	case ClaimRung:
		next, ok, _ := p.AdmitRung(st, id, run.Pass, run.Rung, now)
		return next, ok
	}
	return st, false
}

// WakeOrder is the order in which a type's held passes are looked at,
// given oldest first with since giving when each was held: as they are,
// or — for a held backlog whose re-admitted tasks failed
// (scoring.Backlog.NewestFirst) — those past the hold time still first,
// oldest first, then the rest newest first. The sweeper wakes them in
// this order and the what-if replays them in it. held is not modified.
func WakeOrder[T any](held []T, since func(T) time.Time, newestFirst bool, hold time.Duration, now time.Time) []T {
	if !newestFirst {
		return held
	}
	n := 0
	for n < len(held) && now.Sub(since(held[n])) >= hold {
		n++
	}
	out := slices.Clone(held)
	slices.Reverse(out[n:])
	return out
}
