// Package trust decides whether a task type is trusted enough to be dispatched
// (SPEC §4).
//
// The logic is pure: Score and Policy.Evaluate compute a type's trust from its
// recent outcomes, and Policy.Record, Policy.Gate and Policy.AdmitCanary
// compute the next Stats of a type from the current one.
//
// A type's outcomes are a stream, not a value anyone rewrites: each outcome is
// one message on the type's subject (OutcomeMsg), deduplicated by its key and
// kept Keep deep by the stream, and View follows them into each type's window
// in memory. What the gate itself decides — its block streak, remembered
// decisions and canary places — Store keeps in a KV bucket under
// compare-and-set, written only when a decision changes it. Spending counts
// what each type spends per day in server-side counters.
package trust
