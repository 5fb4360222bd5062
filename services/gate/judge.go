package gate

import (
	"context"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// judgement is what a sweep judges of one type: whether its held passes
// may go, and how many more it wakes.
type judgement struct {
	scoring      trust.Policy
	exempt       bool
	first, retry trust.Verdict
	probe        bool // a probe of the type is due
	backlog      trust.Backlog
	readmits     int                 // passes held for trust it wakes to re-admit
	limited      bool                // readmits is bounded by the type's free trial places
	places       int                 // canary places free for passes waiting for canaries
	stats        trust.Stats         // the type's evidence and gate facts, as the view holds them
	rungsTaken   map[events.Rung]int // rung places this sweep's wakes are about to ask for
	tries        map[events.Rung]int // the type's retries measured on a rung (rungTries)
	// room is how many more passes bound for the model the sweep may wake
	// in bulk (Config.MaxBacklog), shared by every lane of the sweep;
	// quota the part of it a lane of passes waiting their turn may take.
	room *int
	// short is set when a pass bound for the model was left asleep for
	// want of room: the sweeper sweeps again soon.
	short *bool
	quota int
}

// full reports whether the sweep has no room left for a pass bound for
// the model; wants, whether the pass at hand would take some: then it is
// left asleep for want of room, and the sweeper sweeps again soon.
func (j *judgement) full(wants bool) bool {
	if *j.room > 0 {
		return false
	}
	if wants {
		j.starve()
	}
	return true
}

// starve notes that a pass bound for the model was left asleep for want
// of room (or of its lane's share of it).
func (j *judgement) starve() {
	if j.short != nil {
		*j.short = true
	}
}

// open reports whether a pass held for its type's trust may be
// re-admitted: its type is over its threshold (for a retry, judged on its
// settled tasks), or exempt, and its held backlog is not paused.
func (j *judgement) open(e services.HeldEntry) bool {
	if !j.exempt && j.backlog.Paused() {
		return false // re-admitted held tasks fail: the rest go as probes
	}
	if e.Retry {
		return j.exempt || !j.retry.Below
	}
	return j.exempt || !j.first.Below
}

// take takes one of the sweep's room for a pass bound for the model.
func (j *judgement) take() bool {
	if j.full(true) {
		return false
	}
	*j.room--
	return true
}

// room is how many passes bound for the model a sweep may wake in bulk:
// Config.MaxBacklog less the messages waiting, not yet delivered, on the
// way to the model — at the prompt builder's consumer and the executor's.
// Unbounded when MaxBacklog is negative, or when a consumer cannot be read
// (none yet, or no grant): the sweep then wakes as it would without the
// bound, and says why once.
func (s *Service) room(ctx context.Context, stream jetstream.Stream) int {
	if s.cfg.MaxBacklog < 0 {
		return math.MaxInt
	}
	waiting := 0
	for _, name := range []string{services.ConsumerPrompt, services.ConsumerExecutor} {
		c, err := stream.Consumer(ctx, name)
		var info *jetstream.ConsumerInfo
		if err == nil {
			info, err = c.Info(ctx)
		}
		if err != nil {
			s.full.Store(false)
			if !s.unbounded.Swap(true) && ctx.Err() == nil {
				s.log.Warn("the backlog before the model cannot be read: the sweeper wakes passes without bounding it", "consumer", name, "err", err)
			}
			return math.MaxInt
		}
		waiting += int(info.NumPending)
	}
	s.unbounded.Store(false)
	s.full.Store(waiting >= s.cfg.MaxBacklog)
	return max(0, s.cfg.MaxBacklog-waiting)
}

// judge judges typ as the sweeper's view holds it at now.
func (s *Service) judge(typ string, now time.Time) *judgement {
	pol := s.cfg.Policy.Snapshot().For(typ)
	j := &judgement{scoring: pol.Scoring(s.cfg.Scoring).WithDefaults()}
	stats := s.cfg.View.Stats(typ)
	j.stats = stats // the rung waits' evidence and places
	pool := s.pool()
	prior := j.scoring.PriorOf(pool, typ)
	j.scoring.Canary = j.scoring.CanariesWith(prior)
	j.first, j.retry = j.scoring.EvaluateWith(typ, stats, prior, false), j.scoring.EvaluateWith(typ, stats, prior, true)
	j.exempt = pol.IsExempt() || j.scoring.Threshold < 0
	_, probe := j.scoring.HeldProbe(stats, now)
	j.backlog = j.scoring.BacklogOf(stats)
	j.probe = probe && !j.exempt && (j.first.Below || j.retry.Below || j.backlog.Paused())
	j.readmits = s.cfg.Readmit
	if !j.exempt && j.scoring.ReadmitLimited(j.backlog, j.first.Probation) { // the look admits no more than the free trial places
		j.readmits = min(j.readmits, max(0, j.scoring.TrialPlaces(stats)-task.LiveHolders(stats, j.scoring, now, "")))
		j.limited = true
	}
	if j.canaryRound() {
		j.places = max(0, j.scoring.Canary-task.LiveHolders(stats, j.scoring, now, ""))
	}
	return j
}

// rungMoved reports whether e, a retry waiting for a rung when the sweeper
// woke it as w, may go before w's rewake: it waits for another rung now,
// its rung has been measured since, or a retry on it has an outcome since
// (the place its look found taken may be free: a rung whose retries fail
// is climbed one canary at a time, and each waits for the one before).
func (j *judgement) rungMoved(e services.HeldEntry, w woken) bool {
	return e.Hold == events.HoldRung && (e.Rung != w.rung || !w.measured && !j.scoring.RungThin(j.stats, e.Rung) || j.rungTries(e.Rung) > w.tries)
}

// wake is the sweeper's wake of e, for why: a place wake while e waits
// for canaries of a type still sending them; for a retry waiting for a
// rung, what the view had measured on the rung (rungMoved reads it back).
func (j *judgement) wake(e services.HeldEntry, why string) wake {
	w := wake{entry: e, why: why, place: e.Canary() && j.canaryRound()}
	if e.Hold == events.HoldRung {
		w.measured, w.tries = !j.scoring.RungThin(j.stats, e.Rung), j.rungTries(e.Rung)
	}
	return w
}

// rungTries is how many of the type's retries on rung the view has
// measured (scoring.Policy.RungRate), read once per judgement.
func (j *judgement) rungTries(rung events.Rung) int {
	if n, ok := j.tries[rung]; ok {
		return n
	}
	if j.tries == nil {
		j.tries = map[events.Rung]int{}
	}
	n, _ := j.scoring.RungRate(j.stats, rung)
	j.tries[rung] = n
	return n
}

// tookRung counts a place on rung a woken pass's look is about to ask for.
func (j *judgement) tookRung(rung events.Rung) {
	if j.rungsTaken == nil {
		j.rungsTaken = map[events.Rung]int{}
	}
	j.rungsTaken[rung]++
}

// canaryRound reports whether the type still sends canaries: unproven,
// neither exempt nor ungated.
func (j *judgement) canaryRound() bool { return j.first.Unproven && !j.exempt }

// quiet reports whether neither e nor any pass of its lane held after it
// can be due: e has not waited its time (the hold time, or the canary
// TTL), and nothing is left to wake but passes that have.
func (j *judgement) quiet(e services.HeldEntry, now time.Time) bool {
	if e.Hold == events.HoldQueued {
		if j.quota <= 0 { // the lane's share of the room is used up
			j.starve()
			return true
		}
		return j.full(true)
	}
	if e.Canary() {
		bulk := !j.canaryRound() || now.Sub(e.Since) >= j.scoring.CanaryTTL
		return (j.places <= 0 || !j.canaryRound()) && (!bulk || j.full(true))
	}
	if e.Hold == events.HoldRung {
		return false // its lane's passes wait for different rungs: each is judged (due)
	}
	return now.Sub(e.Since) < j.scoring.HoldTime && (j.readmits <= 0 || j.full(j.open(e))) && !j.probe
}

// due is why the sweep wakes e, "" when it leaves it asleep.
func (j *judgement) due(e services.HeldEntry, now time.Time) string {
	if e.Hold == events.HoldQueued {
		if j.quota > 0 && j.take() {
			j.quota--
			return WakeQueued
		}
		return ""
	}
	if e.Hold == events.HoldRung {
		p := j.scoring
		switch {
		case j.exempt, !p.RungThin(j.stats, e.Rung), now.Sub(e.Since) >= p.CanaryTTL:
			if j.take() { // its look climbs on the rung's evidence, or lets it go
				return WakeRung
			}
		case p.RungPlaces(j.stats, e.Rung, now, "")+j.rungsTaken[e.Rung] < p.RungCanary:
			if j.take() {
				j.tookRung(e.Rung) // its look is about to ask for the place
				return WakeRung
			}
		}
		return ""
	}
	if e.Canary() {
		switch {
		case j.canaryRound() && j.places > 0:
			j.places--
			return WakeCanary
		case !j.canaryRound(), now.Sub(e.Since) >= j.scoring.CanaryTTL:
			if j.take() { // its look admits it, or holds it for trust
				return WakeCanary
			}
		}
		return ""
	}
	open := j.open(e)
	switch {
	case open && j.readmits > 0:
		if j.take() {
			j.readmits--
			return WakeReadmit
		}
	case open:
		// Re-admitted in turn, even past its hold time: its look admits
		// it, or hands it to a human.
	case now.Sub(e.Since) >= j.scoring.HoldTime:
		return WakeExpired
	case j.probe:
		j.probe = false
		return WakeProbe
	}
	return ""
}
