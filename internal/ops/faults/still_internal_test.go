package faults

import (
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// TestMoved names exactly the streams whose last sequence changed.
func TestMoved(t *testing.T) {
	before := map[string]uint64{}
	for i, name := range checkedStreams {
		before[name] = uint64(10 * (i + 1))
	}
	same := map[string]uint64{}
	for k, v := range before {
		same[k] = v
	}
	if got := moved(before, same); got != "" {
		t.Errorf("moved(unchanged) = %q, want none", got)
	}
	after := map[string]uint64{}
	for k, v := range before {
		after[k] = v
	}
	after[services.Stream]++
	after[events.KVStream(services.BucketTasks)] += 2
	want := "DISPATCH 10→11, KV_dispatch_tasks 50→52"
	if got := moved(before, after); got != want {
		t.Errorf("moved = %q, want %q", got, want)
	}
}
