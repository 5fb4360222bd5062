// Package history keeps the outcome history of each (task type, subject) and
// renders it for a prompt (SPEC §5).
//
// Format is pure: it turns entries into the <previous_attempts> block, with
// everything escaped so text from a model or a tool cannot break out of it.
// Store keeps each (type, subject)'s last outcomes and last failures in one
// small value of a NATS JetStream KV bucket, read in one get and appended
// under compare-and-set, so concurrent recorders lose nothing and a
// redelivered entry is stored once.
package history
