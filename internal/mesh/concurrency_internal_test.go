package mesh

import (
	"testing"

	"github.com/dispatchmesh/dispatchmesh/services"
)

func TestConcurrency(t *testing.T) {
	executor := services.Spec{Name: Executor, Concurrency: 16}
	recorder := services.Spec{Name: Recorder, Concurrency: 8}
	tests := []struct {
		name string
		o    Options
		spec services.Spec
		want int
	}{
		{"the service's default", Options{}, executor, 16},
		{"mesh-wide", Options{Concurrency: 4}, executor, 4},
		{"per service over mesh-wide", Options{Concurrency: 4, ServiceConcurrency: map[string]int{Executor: 1000}}, executor, 1000},
		{"another service keeps mesh-wide", Options{Concurrency: 4, ServiceConcurrency: map[string]int{Executor: 1000}}, recorder, 4},
		{"another service keeps its default", Options{ServiceConcurrency: map[string]int{Executor: 1000}}, recorder, 8},
	}
	for _, tt := range tests {
		if got := tt.o.concurrency(tt.spec); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// A process seals the state only where its executor can open what its other
// services seal, unless a key is configured for processes that share it.
func TestSealing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		o        Options
		sealing  bool
		mistaken bool
	}{
		{"the whole mesh", Options{Services: All}, true, false},
		{"intake and executor", Options{Services: []string{Intake, Executor}}, true, false},
		{"the executor alone", Options{Services: []string{Executor}}, false, false},
		{"the recorder alone", Options{Services: []string{Recorder}}, false, false},
		{"gate and prompt builder", Options{Services: []string{Gate, Prompt, Executor}}, false, false},
		{"a key for the recorder alone", Options{Services: []string{Recorder}, StateKey: make([]byte, 32)}, true, false},
		{"a short key", Options{Services: All, StateKey: make([]byte, 8)}, false, true},
	} {
		s, err := tc.o.sealing()
		if (err != nil) != tc.mistaken || (s != nil) != tc.sealing {
			t.Errorf("%s: sealer %v, error %v", tc.name, s != nil, err)
		}
	}
}
