package whatif

import (
	"fmt"
	"testing"
	"time"
)

// bigHistory is a history of n tasks over six types: healthy, two of
// mixed difficulty, hopeless, and a type that regresses half way.
func bigHistory(n int) []Event {
	h := &history{at: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	for i := range n {
		id := fmt.Sprintf("t-%05d", i)
		switch i % 6 {
		case 0:
			h.task(id, "healthy", 7, func(int) bool { return true })
		case 1:
			h.task(id, "mixed", 7, func(k int) bool { return k == 1+i%4 })
		case 2:
			h.task(id, "coinflip", 7, func(k int) bool { return (i+k)%2 == 0 })
		case 3:
			h.task(id, "hopeless", 7, func(int) bool { return false })
		case 4:
			h.task(id, "regress", 7, func(int) bool { return i < n/2 })
		default:
			h.task(id, "late", 7, func(k int) bool { return k == 3 })
		}
	}
	return h.evs
}

// BenchmarkReplay1200 re-decides a history of 1,200 tasks of six types
// (about 13,000 events) under a policy with another threshold and ladder.
func BenchmarkReplay1200(b *testing.B) {
	evs := bigHistory(benchTasks)
	pol, err := parseFile(`{"defaults": {"rung_floor": 0, "threshold": 0.4, "max_retries": 4}}`)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(len(evs)), "events")
	for b.Loop() {
		r := Replay(evs, Options{Policy: pol})
		if r.Tasks != benchTasks {
			b.Fatalf("%d tasks", r.Tasks)
		}
	}
}

var benchTasks = 1200
