package recorder_test

import (
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/services/recorder"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

func TestConfigValidateJoinsEveryProblem(t *testing.T) {
	err := recorder.Config{Scoring: trust.Policy{ProbeAfter: -1}}.Validate()
	for _, want := range []string{"Tasks store is required", "History store is required", "Trust (the outcome windows) is required", "probe after -1"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %q", err, want)
		}
	}
	if _, err := recorder.New(recorder.Config{}); err == nil {
		t.Error("New accepted an empty config")
	}
}
