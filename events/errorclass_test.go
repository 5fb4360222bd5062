package events_test

import (
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
)

func TestErrorClassesShortCircuitAndFault(t *testing.T) {
	tests := []struct {
		class                     events.ErrorClass
		shortCircuits, deployment bool
	}{
		{events.ErrorClassAuth, true, true},
		{events.ErrorClassQuota, true, true},
		{events.ErrorClassConfig, true, true},
		{events.ErrorClassToolUnavailable, true, true},
		{events.ErrorClassTimeout, true, false},
		{events.ErrorClassTransient, false, false},
		{events.ErrorClassDeterministic, false, false},
		{events.ErrorClassTask, false, false},
		{events.ErrorClassInvalidOutput, false, false},
		{events.ErrorClassRefused, false, false},
		{events.ErrorClassDeadEnd, false, false},
		{events.ErrorClassStep, false, false},
		{events.ErrorClassBudget, false, false},
		{events.ErrorClassModel, false, false},
		{"", false, false},
	}
	for _, tt := range tests {
		if got := events.ShortCircuits(tt.class); got != tt.shortCircuits {
			t.Errorf("ShortCircuits(%q) = %v, want %v", tt.class, got, tt.shortCircuits)
		}
		if got := events.DeploymentFault(tt.class); got != tt.deployment {
			t.Errorf("DeploymentFault(%q) = %v, want %v", tt.class, got, tt.deployment)
		}
	}
}
