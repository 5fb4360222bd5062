package services

import (
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Names of everything the mesh provisions. deploy/ grants permissions on them.
const (
	// Stream holds every task event and every review record (Limits retention).
	Stream = events.Stream
	// SubmitStream holds the clients' submissions, intake's input.
	SubmitStream = events.SubmitStream
	// AdvisoryStream captures max-delivery advisories of Stream's consumers, so
	// a message whose worker died on its last delivery still reaches review.
	AdvisoryStream = "DISPATCH_ADVISORIES"
	// CounterStream holds the server-side spend counters (trust.Spending):
	// dispatch.count.<type>.<unit>.<day>, one message per counter.
	CounterStream = "DISPATCH_COUNTERS"

	// OutcomeStream holds the outcomes that score each type's trust: the
	// recorder publishes one small message per outcome, trust.View follows
	// them into windows; no shared value is rewritten.
	OutcomeStream = trust.OutcomeStream

	BucketTasks   = events.BucketTasks   // task state by task id
	BucketTrust   = events.BucketTrust   // the gate's facts by task type: block streak, decisions, canary places
	BucketHistory = events.BucketHistory // last outcomes and failures by (type, subject)
	BucketHeld    = events.BucketHeld    // the held index: passes held back (trust, canaries), asleep until woken (HeldIndex)
	// BucketPolicy holds the per-type policies under one key, "current"
	// (package policy), keeping every revision (PolicyRevisions).
	BucketPolicy = "dispatch_policy"
	// BucketModels holds what every executor instance shares about the
	// models it calls: each model's circuit (cool-down) and the marks of
	// deployments found wrong (a key refused, a model not found).
	BucketModels = "dispatch_models"

	// Durable consumer names, one per stage; instances of a stage share it.
	ConsumerIntake   = "intake"
	ConsumerVerifier = "verifier"
	ConsumerGate     = "gate"
	ConsumerGateHeld = "gate_held"
	ConsumerGateWake = "gate_wake"
	ConsumerPrompt   = "prompt"
	ConsumerExecutor = "executor"
	ConsumerRecorder = "recorder"
	ConsumerReaper   = "reaper"

	// MicroService is the name of the request-reply service (synchronous submit).
	MicroService = "dispatch"
)

// StreamOf is the stream the durable consumer name reads: intake the
// submissions, the reaper the advisories, every other stage the task
// stream.
func StreamOf(durable string) string {
	switch durable {
	case ConsumerIntake:
		return SubmitStream
	case ConsumerReaper:
		return AdvisoryStream
	}
	return Stream
}
