package task

import (
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// Emission is the event a recorded attempt leads to: the task's next stage
// (Stage set) or a review record for a human (Review set).
type Emission struct {
	// Stage is the next stage (events.StageSucceeded, events.StageRetry,
	// events.StageVerified),
	// "" when the task goes to review.
	Stage string
	// Review is the review reason (events.ReviewStuck,
	// events.ReviewEscalated), "" when the task goes on.
	Review string
	// Name is the event's name (events.Event*).
	Name string
	// Reason is a review record's one-line reason.
	Reason string
	// Base is the published event's base: b's, or the next run's for a retry.
	Base events.Base
	// Event is the body: events.Succeeded, events.Retry, events.Verified,
	// events.Stuck or events.Escalated.
	Event any
}

// Unverified is the event of a pass that has nothing to verify — its type
// has no verifier — and so goes to the gate at once: verified with verdict
// skipped, as the verifier would publish it, without the hop through it.
// reason is why the pass runs ("" for a task's first).
func Unverified(b events.Base, reason string) events.Verified {
	return events.Verified{Base: b, Reason: reason,
		Verification: events.Verification{Verdict: events.VerdictSkipped, Verifier: policy.VerifierNone}}
}

// Emit says what the attempt (b, res), recorded by Record into st, leads
// to: success ends the task, a retry (through the verifier, or straight to
// the gate for a type without one) or a park starts the next run (NextRun),
// a task out of skips is stuck, and a handoff or a failure escalates to a
// human with the type's trust score (score) and what the task spent.
func Emit(st events.TaskState, b events.Base, res events.Result, pol policy.Type, score float64) Emission {
	switch st.Decision {
	case events.DecisionSucceeded:
		return Emission{Stage: events.StageSucceeded, Name: events.EventSucceeded, Base: b,
			Event: events.Succeeded{Base: b, Result: res}}
	case events.DecisionRetry, events.DecisionPark:
		next := b
		next.Run = NextRun(&st, b.Run, res, pol)
		retry := events.Retry{Base: next, Reason: oneLine(res.Error), WakeAt: st.WakeAt}
		if st.Decision == events.DecisionPark {
			retry.Reason = st.Reason
		} else if !pol.Verifies() {
			// Nothing to verify and nothing to wait for: straight to the gate.
			return Emission{Stage: events.StageVerified, Name: events.EventVerified, Base: next, Event: Unverified(next, retry.Reason)}
		}
		return Emission{Stage: events.StageRetry, Name: events.EventRetry, Base: next, Event: retry}
	case events.DecisionStuck:
		return Emission{Review: events.ReviewStuck, Name: events.EventStuck, Reason: st.Reason, Base: b,
			Event: events.Stuck{Base: b, Reason: st.Reason, Skips: st.Skips, Attempts: st.History}}
	default: // handoff, fail
		return Emission{Review: events.ReviewEscalated, Name: events.EventEscalated, Reason: st.Reason, Base: b,
			Event: events.Escalated{
				Base: b, Reason: st.Reason, TrustScore: score, Attempts: st.History,
				TokensIn: st.TokensIn, TokensOut: st.TokensOut, Cost: st.Cost,
			}}
	}
}

// AsRecorded reports whether st is still as recording the attempt of pass
// left it: that attempt's record is the last, and neither a later pass's
// stage that writes the task's state (the verifier checking the retry, the
// gate stopping it, the executor starting it) nor a human has changed the
// task since. Only then does Emit say what the attempt led to, and only then
// may a redelivered outcome publish it again. Once the task moved on, what
// it led to was published (a retry's next pass began only from it), and the
// state no longer says what it was: the gate that hands the next pass off
// leaves decision handoff where the recorder left retry. A terminal
// decision keeps the pass the state had (Apply moves it only for a retry),
// so it asks for no later pass than the attempt's.
func AsRecorded(st events.TaskState, pass int) bool {
	last, ok := lastRecord(st)
	if !ok || last.Pass != pass || EndedByHuman(st) {
		return false
	}
	switch st.Decision {
	case events.DecisionRetry:
		return st.Pass == pass+1 && st.Status == events.StatusPending
	case events.DecisionPark:
		return st.Pass == pass+1 && st.Status == events.StatusParked
	case events.DecisionSucceeded:
		return st.Pass <= pass && st.Status == events.StatusSucceeded
	case events.DecisionHandoff, events.DecisionStuck:
		return st.Pass <= pass && st.Status == events.StatusBlocked
	case events.DecisionFail:
		return st.Pass <= pass && st.Status == events.StatusFailed
	}
	return false
}
