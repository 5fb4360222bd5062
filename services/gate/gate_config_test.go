package gate_test

import (
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/services/gate"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

func TestConfigValidateJoinsEveryProblem(t *testing.T) {
	err := gate.Config{Scoring: trust.Policy{Window: -1, Decay: 2}}.Validate()
	for _, want := range []string{"Trust store is required", "window -1", "decay 2"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %q", err, want)
		}
	}
	if _, err := gate.New(gate.Config{}); err == nil {
		t.Error("New accepted a config without a Trust store")
	}
}
