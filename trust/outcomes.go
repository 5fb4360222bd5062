package trust

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// The outcome stream: every outcome that counts for a type's trust is one
// small message on dispatch.outcome.<type> in the stream OutcomeStream,
// which keeps the newest Keep of each type (its per-subject limit). Nobody
// compare-and-sets a window: a recorder publishes its outcome, and whoever
// scores a type (the gate, the recorder for its escalation records, the
// review page) reads the type's messages into a window in memory (View).
const (
	// OutcomeStream holds the outcomes (Limits retention, Keep per type).
	OutcomeStream = "DISPATCH_OUTCOMES"
	// OutcomeRoot prefixes the outcome subjects: dispatch.outcome.<type>.
	OutcomeRoot = "dispatch.outcome"
	// OutcomeFilter matches every outcome subject.
	OutcomeFilter = OutcomeRoot + ".*"
	// EventOutcome names an outcome message (the Dispatch-Event header).
	EventOutcome = "trust.outcome.v1"
	// Keep is how many outcomes of a type the stream keeps: twice the
	// largest window (MaxWindow), so an outcome published again after it
	// left the deduplication window (it sorts before the window by its
	// time) can never push one of the window's out of the stream.
	Keep = 2 * MaxWindow
	// MaxWindow is the largest trust window a policy may ask for.
	MaxWindow = 100
)

// OutcomeSubject is the subject of taskType's outcomes.
func OutcomeSubject(taskType string) string { return OutcomeRoot + "." + taskType }

// OutcomeMsg is outcome o of taskType as published on the outcome stream:
// its key is its Nats-Msg-Id, so the stream keeps one copy of an outcome
// however often it is published within the deduplication window.
func OutcomeMsg(taskType string, o Outcome) (*nats.Msg, error) {
	if !events.ValidType(taskType) || o.Key == "" {
		return nil, fmt.Errorf("%w: outcome of type %q with key %q", ErrInvalid, taskType, o.Key)
	}
	data, err := json.Marshal(o)
	if err != nil {
		return nil, fmt.Errorf("trust: encode outcome %s: %w", o.Key, err)
	}
	m := nats.NewMsg(OutcomeSubject(taskType))
	m.Header.Set(nats.MsgIdHdr, o.Key)
	m.Header.Set(events.HeaderEvent, EventOutcome)
	m.Data = data
	return m, nil
}

// DecodeOutcome reads an outcome message.
func DecodeOutcome(data []byte) (Outcome, error) {
	var o Outcome
	if err := json.Unmarshal(data, &o); err != nil {
		return o, fmt.Errorf("trust: decode outcome: %w", err)
	}
	if o.Key == "" {
		return o, fmt.Errorf("%w: outcome without a key", ErrInvalid)
	}
	return o, nil
}

// Insert returns window with o in its place by (At, Key), at most limit
// outcomes kept (the oldest dropped); changed is false when an outcome with
// o's key is already there. The window's order does not depend on the order
// outcomes arrive in, so a replay of the stream (dispatch rebuild) yields
// the same window. window is not modified.
func Insert(window []Outcome, o Outcome, limit int) (next []Outcome, changed bool) {
	if slices.ContainsFunc(window, func(x Outcome) bool { return x.Key == o.Key }) {
		return window, false
	}
	i := len(window)
	for i > 0 && outcomeAfter(window[i-1], o) {
		i--
	}
	if limit > 0 && len(window) >= limit && i == 0 {
		return window, false // older than everything a full window keeps
	}
	return lastN(slices.Insert(slices.Clone(window), i, o), limit), true
}
