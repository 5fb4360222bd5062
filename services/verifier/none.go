package verifier

import (
	"context"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// None is the checker of types without a verifier: every task goes on with
// verdict skipped, and nothing is called.
type None struct{}

// Check returns verdict skipped.
func (None) Check(context.Context, events.Task) (events.Verification, error) {
	return events.Verification{Verdict: events.VerdictSkipped, Verifier: policy.VerifierNone}, nil
}
