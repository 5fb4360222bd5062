package events_test

import (
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Passes waiting for canaries or for a rung's first retries wait for
// outcomes of their type; those held for trust or their turn do not.
func TestHoldForOutcomes(t *testing.T) {
	for h, want := range map[events.Hold]bool{
		events.HoldCanary: true, events.HoldRung: true,
		events.HoldTrust: false, events.HoldQueued: false, "": false,
	} {
		if got := h.ForOutcomes(); got != want {
			t.Errorf("%q: ForOutcomes %v, want %v", h, got, want)
		}
	}
}
