// Package history keeps the outcome history of each (task type, subject) and
// renders it for a prompt (SPEC §5).
//
// Format is pure: it turns entries into the <previous_attempts> block, with
// everything escaped so text from a model or a tool cannot break out of it.
// Store keeps the entries of each (type, subject) in a NATS JetStream KV
// bucket, appended under compare-and-set so concurrent recorders lose nothing
// and a redelivered entry is stored once.
package history
