package mesh

import (
	"testing"

	"dispatchmesh/services"
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
