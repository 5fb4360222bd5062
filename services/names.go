package services

import "dispatchmesh/events"

// Names of everything the mesh provisions. deploy/ grants permissions on them.
const (
	// Stream holds every task event and every review record (Limits retention).
	Stream = events.Stream
	// AdvisoryStream captures max-delivery advisories of Stream's consumers, so
	// a message whose worker died on its last delivery still reaches review.
	AdvisoryStream = "DISPATCH_ADVISORIES"
	// CounterStream holds the server-side spend counters (trust.Spending):
	// dispatch.count.<type>.<unit>.<day>, one message per counter.
	CounterStream = "DISPATCH_COUNTERS"

	BucketTasks   = events.BucketTasks   // task state by task id
	BucketTrust   = events.BucketTrust   // trust stats by task type
	BucketHistory = events.BucketHistory // outcome history by (type, subject)
	// BucketPolicy holds the per-type policies under one key, "current"
	// (package policy), keeping every revision (PolicyRevisions).
	BucketPolicy = "dispatch_policy"

	// Durable consumer names, one per stage; instances of a stage share it.
	ConsumerIntake   = "intake"
	ConsumerVerifier = "verifier"
	ConsumerGate     = "gate"
	ConsumerPrompt   = "prompt"
	ConsumerExecutor = "executor"
	ConsumerRecorder = "recorder"
	ConsumerReaper   = "reaper"

	// MicroService is the name of the request-reply service (synchronous submit).
	MicroService = "dispatch"
)
