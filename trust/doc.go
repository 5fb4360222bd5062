// Package trust decides whether a task type is trusted enough to be dispatched
// (SPEC §4).
//
// The logic is pure: Score and Policy.Evaluate compute a type's trust from its
// recent outcomes, and Policy.Record and Policy.Gate compute the next Stats of
// a type from the current one. Store keeps one Stats per task type in a NATS
// JetStream KV bucket and applies those functions under compare-and-set, so
// many recorder and gate instances can update the same type without losing an
// update, and a redelivered message changes nothing the second time.
package trust
