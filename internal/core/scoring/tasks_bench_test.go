package scoring

import (
	"fmt"
	"testing"
	"time"
)

// The gate folds a type's window on every pass: a full window of tasks
// that each took one attempt, and one where tasks took three.
func BenchmarkTasks(b *testing.B) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, per := range []int{1, 3} {
		var os []Outcome
		for i := range 50 {
			t := fmt.Sprintf("t%d", i/per)
			os = append(os, Outcome{Key: fmt.Sprintf("%s:%d:outcome", t, i%per+1), Task: t, Success: i%per == per-1, End: i%per == per-1, At: at.Add(time.Duration(i) * time.Second)})
		}
		b.Run(fmt.Sprintf("attempts=%d", per), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Tasks(os)
			}
		})
	}
}
