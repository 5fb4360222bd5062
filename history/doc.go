// Package history keeps the outcome history of each (task type, subject) and
// renders it for a prompt (SPEC §5).
//
// Format is pure: it turns entries into the <previous_attempts> block, with
// everything escaped so text from a model or a tool cannot break out of it.
// The history itself is a stream (Stream): each recorded attempt is a small
// message on its (type, subject)'s subjects, deduplicated by the attempt's
// key and kept Keep deep per subject by the stream, so concurrent recorders
// never contend for a shared value and a redelivered entry is stored once.
// Log reads a subject's history in one request; ReadAll reads all of it.
package history
