package gate

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// HandleHeld looks again at a pass the gate held back: admitted when its
// type's canaries have scored it or its trust recovered (or as a probe of
// its held tasks), looked at later while it must still wait, and sent to
// a human once held for trust past the hold time.
func (s *Service) HandleHeld(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	var ev events.Held
	if err := services.Decode(m, &ev); err != nil {
		return nil, err
	}
	asleep := s.cfg.Held != nil // the pass sleeps in the held index between looks
	st, found, err := s.taskState(ctx, ev.Task.ID)
	if err != nil {
		return nil, err
	}
	if asleep && found && (task.Held(st, ev.Run.Pass) || ev.Hold != events.HoldTrust && (isWake(m) || m.Delivered > 1)) {
		// Admitted by an earlier look, the pass still shows held (or, for
		// a pass that waited for canaries or its turn, as verified) until
		// the executor starts it: a wake published meanwhile must not hold
		// it again.
		admitted, err := s.admitted(ctx, ev.Task.ID, ev.Run.Pass)
		if err != nil {
			return nil, err
		}
		if admitted {
			s.log.Info("held pass dropped: an earlier look admitted it", "task", ev.Task.ID, "pass", ev.Run.Pass)
			return nil, s.cfg.Held.Delete(ctx, heldKey(ev))
		}
	}
	if found && movedOn(st, ev.Run.Pass) {
		s.log.Info("held pass dropped: the task moved on or ended", "task", ev.Task.ID, "pass", ev.Run.Pass, "status", st.Status)
		if asleep {
			return nil, s.cfg.Held.Delete(ctx, heldKey(ev))
		}
		return nil, nil
	}
	outs, err := s.decide(ctx, m, ev.Base, ev.Sealed, &ev, &stateRead{st, found})
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

// isWake reports whether m is a wake the sweeper published, not a held
// event's own delivery.
func isWake(m *services.Msg) bool {
	_, stage, ok := events.ParseTaskSubject(m.Subject)
	return ok && stage == events.StageWake
}

// errAsleep ends a look that left its pass asleep in the held index.
var errAsleep = errors.New("gate: the held pass sleeps in the held index")

// heldKey is the held index key of the pass ev holds.
func heldKey(ev events.Held) string {
	return services.HeldKey(ev.Task.Type, ev.At, ev.Task.ID, ev.Run.Pass)
}

// sleep ends a look at a held pass that must go on waiting, for hold (its
// type's trust, its canaries, a place on rung, or its turn): with the held index, the pass sleeps
// there until the sweeper wakes it (errAsleep: HandleHeld acks the
// message); without one, the message is snoozed in the held consumer.
func (s *Service) sleep(ctx context.Context, m *services.Msg, p trust.Policy, held *events.Held, hold events.Hold, rung events.Rung) error {
	if s.cfg.Held == nil {
		if hold != events.HoldTrust {
			return services.Snooze(canaryDelay(m.Delivered, p.CanaryTTL), ErrCanaryWait)
		}
		return services.Snooze(heldDelay(m.Delivered, p.HoldTime), ErrHeld)
	}
	if err := s.cfg.Held.Put(ctx, services.HeldEntryOf(*held, m.Seq, hold, rung)); err != nil {
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

// hold holds the pass for its type's trust: the task's status is held
// (SPEC §2); a verified pass goes to the held consumer as a held event,
// whose look leaves it asleep in the held index until the sweeper wakes it.
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
	return nil, s.sleep(ctx, m, p, held, events.HoldTrust, "")
}

// park hands a pass to the held consumer, held for hold: one held event
// per pass and hold (its Nats-Msg-Id names both), so a pass that waited for
// its canaries and is then held for trust is held anew.
func (s *Service) park(b events.Base, hold events.Hold, d events.TrustDecision, sealed *events.Sealed) ([]services.Out, error) {
	if hold == events.HoldTrust { // a wait for canaries is no decision: dispatch_gate_waits_total counts it
		s.decided(context.Background(), b, d, task.ActHold)
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
