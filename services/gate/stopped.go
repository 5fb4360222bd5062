package gate

import (
	"context"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// stateRead is a task's state as read from the store: found is false when
// it has none (or the gate keeps no task store).
type stateRead struct {
	st    events.TaskState
	found bool
}

// stopped republishes the stop of a pass that an earlier delivery of the
// same message decided. The gate writes a stop into the task's state
// (needs_human_review, or blocked by a handoff before the attempt) before
// the router publishes its record, so a gate that crashed or lost the
// server in between leaves the state stopped and no record. Deciding again
// would read trust stats that have moved on and could let the pass
// through: the executor then skips it (the task has ended) and the task
// never ends. So the decision stands: its record goes out as the state
// keeps it (again, when it did reach the stream: the Msg-Id deduplicates).
//
// It returns ok=false when the state holds no stop of this pass (a first
// delivery, or the task moved on). d is the decision as evaluated now; its
// measurements go in the record, the stop's reason and time are the state's.
//
// read is the task's state as the caller has just read it, nil to read it.
func (s *Service) stopped(ctx context.Context, b events.Base, d events.TrustDecision, read *stateRead) ([]services.Out, bool, error) {
	if read == nil {
		st, found, err := s.taskState(ctx, b.Task.ID)
		if err != nil {
			return nil, false, err
		}
		read = &stateRead{st, found}
	}
	if !read.found {
		return nil, false, nil
	}
	st := read.st
	if st.Pass != b.Run.Pass || task.Attempted(st, b.Run.Pass) {
		return nil, false, nil // the recorder's handoff, or not this pass
	}
	b.At = st.UpdatedAt // when the stop was decided (SetStatus and HandOff keep it)
	d.Reason, d.Probe = st.Reason, false
	var (
		out  services.Out
		outs []services.Out
		err  error
	)
	switch {
	case st.Status == events.StatusNeedsHumanReview:
		d.Blocked, d.Cause = true, st.Cause
		if d.Cause == "" { // stopped before states kept the cause
			d.Cause = events.CauseTrust
		}
		if err := s.release(ctx, b.Task.Type, b.Task.ID); err != nil {
			return nil, false, err
		}
		if b.Run.Attempt > 1 { // as block: the end marker of a stopped retry
			marker, err := trust.OutcomeMsg(b.Task.Type, trust.EndMarker(b.Task.ID, b.Run.Pass, b.At))
			if err != nil {
				return nil, false, err
			}
			outs = append(outs, services.OutMsg(marker))
		}
		out, err = services.ToReview(b, events.ReviewGated, events.EventGated, st.Reason,
			events.Gated{Base: b, Trust: d, Reason: st.Reason, Attempts: st.History})
	case st.Status == events.StatusBlocked && st.Decision == events.DecisionHandoff && st.Rung == events.RungHandoff:
		d.Cause = events.CauseRungRate // the gate's only handoff
		if err := s.release(ctx, b.Task.Type, b.Task.ID); err != nil {
			return nil, false, err
		}
		marker, err := trust.OutcomeMsg(b.Task.Type, trust.EndMarker(b.Task.ID, b.Run.Pass, b.At))
		if err != nil {
			return nil, false, err
		}
		outs = append(outs, services.OutMsg(marker))
		out, err = services.ToReview(b, events.ReviewEscalated, events.EventEscalated, st.Reason, events.Escalated{
			Base: b, Reason: st.Reason, Cause: d.Cause, TrustScore: d.Score, Attempts: st.History,
			TokensIn: st.TokensIn, TokensOut: st.TokensOut, Cost: st.Cost,
		})
	default:
		return nil, false, nil
	}
	s.log.Info("redelivered pass stays stopped", "task", b.Task.ID, "pass", b.Run.Pass, "cause", d.Cause, "reason", st.Reason)
	return append(outs, out), true, err
}
