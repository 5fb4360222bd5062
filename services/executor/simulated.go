package executor

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"

	json "github.com/go-json-experiment/json/v1"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// SimulatedModelName is the Model of every simulated answer.
const SimulatedModelName = "simulated"

// Simulated is the built-in SIMULATED model, used when no API key is
// configured so the whole mesh runs end to end without spending anything. It
// calls nothing: every answer is made up, says so in its summary, and carries
// Simulated=true and Model "simulated".
//
// It is deterministic: an attempt succeeds iff a hash of (task id, attempt)
// mapped to [0,1) is below Rate(task type), so the same attempt always gets
// the same answer and a redelivery changes nothing. Tokens are estimated as
// len(text)/4. The zero value always succeeds.
type Simulated struct {
	// Rate is the success rate of a task type, within [0,1]. Default (nil):
	// always 1. RateFromPolicy reads it from the policy's
	// simulated_success_rate.
	Rate func(taskType string) float64
}

// RateFromPolicy is a Simulated.Rate that reads each type's
// simulated_success_rate from src (nil src: built-in defaults, rate 1).
func RateFromPolicy(src *policy.Source) func(taskType string) float64 {
	return func(taskType string) float64 { return src.For(taskType).SuccessRate() }
}

// Complete makes up an answer for req.
func (s Simulated) Complete(ctx context.Context, req Request) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, err
	}
	rate := 1.0
	if s.Rate != nil {
		rate = s.Rate(req.TaskType)
	}
	r := ModelResult{
		Status:   events.OutcomeFailure,
		Approach: fmt.Sprintf("simulated approach for attempt %d", req.Attempt),
		Summary:  "SIMULATED: no model was called; this attempt is reported as failed.",
	}
	if simulatedDraw(req.TaskID, req.Attempt) < rate {
		r.Status = events.OutcomeSuccess
		r.Summary = "SIMULATED: no model was called; this attempt is reported as succeeded."
		r.Changes = []string{"simulated change (nothing was modified)"}
	}
	content, err := json.Marshal(r)
	if err != nil {
		return Response{}, err
	}
	in := 0
	for _, m := range req.Messages {
		in += len(m.Content)
	}
	return Response{
		Content:   string(content),
		Model:     SimulatedModelName,
		TokensIn:  in / 4,
		TokensOut: len(content) / 4,
		Simulated: true,
	}, nil
}

// simulatedDraw maps (task id, attempt) to [0,1), evenly and deterministically.
func simulatedDraw(taskID string, attempt int) float64 {
	h := sha256.Sum256([]byte(taskID + "\x00" + strconv.Itoa(attempt)))
	return float64(binary.BigEndian.Uint64(h[:8])>>11) / (1 << 53)
}
