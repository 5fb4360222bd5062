// Package rebuild recomputes the derived stores — task state, each type's
// trust (its outcomes on the outcome stream, the gate's facts in the trust
// bucket), each subject's outcome history (the history bucket), the spend
// counters, the gate's held index (the held bucket) — from the event stream
// alone, with the same pure functions the services use, and compares them
// with the live stores. After a normal run they agree; a difference means a
// store was written outside the events (or lost), and Apply can restore it
// from the stream.
package rebuild

import (
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Stores are what a replay produces.
type Stores struct {
	Tasks map[string]*events.TaskState
	// Trust is each type's trust as its events imply it: its outcomes,
	// oldest first — the newest trust.Keep by (At, Key), what the outcome
	// stream keeps of the type — and the gate's facts: block streak and
	// remembered gate decisions. Canary places are not among them: the gate
	// gives a place back when it finds its holder ended, which no event
	// records; they are the gate's live admission control (bounded by their
	// TTL), never rebuilt.
	Trust map[string]*trust.Stats
	// History is each (type, subject)'s record by history.Key: its newest
	// outcomes and failures by (At, Key), history.Keep of each, built with
	// history.Record.Add as the recorder's history.Store.Append builds the
	// record it stores in the history bucket.
	History map[string]*history.Record
	// Spend is what each (type, UTC day) spent: the spend counters.
	Spend map[[2]string]trust.DaySpend
	// Held is the gate's held index by services.HeldEntry.Key: an entry
	// for each task held for its type's trust (status held) at its pass,
	// built from the pass's first held event (see heldIndex).
	Held map[string]*services.HeldEntry
	// Events is how many stream messages were replayed.
	Events int
	// Skipped are the events that could not be decoded: reported and left
	// out, the rest of the stream replayed. The mesh could not decode them
	// either (their service dead-lettered them), so it never applied them.
	Skipped []Skipped
	// Fallbacks are the policy revisions events named that the bucket does
	// not hold, recomputed with Options.Fallback instead.
	Fallbacks []Unavailable
	// Horizon is when the oldest event replayed was stored, when the stream
	// no longer holds its first events (they aged out: DISPATCH_MAX_AGE);
	// zero when it holds them all. What the live stores know from before it
	// — a task created earlier, a history entry, an outcome, a day's spend
	// — no replay can say: Compare and Apply take it as the live stores
	// hold it (keepBeforeHorizon).
	Horizon time.Time
	// replayed is the stream sequence of the last message replayed: a held
	// entry naming a later one is the gate's news, which the replay cannot
	// judge (keepAfterReplay).
	replayed uint64
	// steps are each type's steps of its block streak as their events
	// recorded them, in no order: what keepCommitOrder holds the live gate
	// facts to.
	steps map[string]*gateSteps
}
