package client_test

import (
	"encoding/json"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
)

// Which events end a wait: a human's cancel does (it publishes nothing
// else), a requeue does not.
func TestEventFinal(t *testing.T) {
	action := func(a string) []byte {
		data, _ := json.Marshal(events.Action{TaskID: "t1", Action: a, By: "alice"})
		return data
	}
	tests := []struct {
		stage     string
		data      []byte
		final, ok bool
	}{
		{events.StageSucceeded, nil, true, true},
		{events.StageCancelled, nil, true, false},
		{events.StageExecuted, nil, false, false},
		{"review." + events.ReviewEscalated, nil, true, false},
		{"review." + events.ReviewAction, action(events.ActionCancel), true, false},
		{"review." + events.ReviewAction, action(events.ActionRequeue), false, false},
		{"review." + events.ReviewAction, []byte("not json"), false, false},
	}
	for _, tt := range tests {
		final, ok := client.Event{Stage: tt.stage, Data: tt.data}.Final()
		if final != tt.final || ok != tt.ok {
			t.Errorf("%s %s: final %v ok %v, want %v %v", tt.stage, tt.data, final, ok, tt.final, tt.ok)
		}
	}
}
