package executor_test

import (
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

func TestBackoff(t *testing.T) {
	tests := []struct {
		name string
		b    executor.Backoff
		n    int
		r    float64
		want time.Duration
	}{
		{"first, full draw", executor.Backoff{}, 1, 1, time.Second},
		{"first, no draw", executor.Backoff{}, 1, 0, 0},
		{"second, half", executor.Backoff{}, 2, 0.5, time.Second},
		{"ninth", executor.Backoff{}, 9, 1, 256 * time.Second},
		{"capped at 5m", executor.Backoff{}, 10, 1, 5 * time.Minute},
		{"huge n stays capped", executor.Backoff{}, 10000, 0.5, 150 * time.Second},
		{"n below 1 is the first", executor.Backoff{}, 0, 1, time.Second},
		{"custom", executor.Backoff{Base: 100 * time.Millisecond, Factor: 3, Max: time.Second}, 3, 1, 900 * time.Millisecond},
		{"custom cap", executor.Backoff{Base: 100 * time.Millisecond, Factor: 3, Max: time.Second}, 4, 1, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.b.Delay(tt.n, tt.r); got != tt.want {
				t.Errorf("Delay(%d, %v) = %v, want %v", tt.n, tt.r, got, tt.want)
			}
		})
	}
}

func TestBackoffHalfJitter(t *testing.T) {
	tests := []struct {
		name string
		b    executor.Backoff
		n    int
		r    float64
		want time.Duration
	}{
		{"first, no draw", executor.Backoff{}, 1, 0, 500 * time.Millisecond},
		{"first, half", executor.Backoff{}, 1, 0.5, 750 * time.Millisecond},
		{"first, full draw", executor.Backoff{}, 1, 1, time.Second},
		{"fourth, no draw", executor.Backoff{}, 4, 0, 4 * time.Second},
		{"capped, no draw", executor.Backoff{Max: time.Minute}, 30, 0, 30 * time.Second},
		{"capped, full draw", executor.Backoff{Max: time.Minute}, 30, 1, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.b.HalfJitter(tt.n, tt.r); got != tt.want {
				t.Errorf("HalfJitter(%d, %v) = %v, want %v", tt.n, tt.r, got, tt.want)
			}
		})
	}
}
