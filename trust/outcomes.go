package trust

import (
	"fmt"

	json "github.com/go-json-experiment/json/v1"
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
