package history_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

func TestEntryCapped(t *testing.T) {
	at := time.Date(2026, 5, 18, 14, 22, 0, 0, time.UTC)
	short := history.Entry{Key: "t1:1", TaskID: "t1", Attempt: 1, Outcome: events.OutcomeFailure,
		Approach: "null check", Summary: "wrong place", Error: "still 500", At: at}
	long := func(s string, n int) string { return strings.Repeat(s, n) }
	tests := []struct {
		name string
		in   history.Entry
		want history.Entry
	}{
		{"within the caps", short, short},
		{"approach kept whole up to the answer's cap", history.Entry{Approach: long("a", events.MaxApproach)},
			history.Entry{Approach: long("a", events.MaxApproach)}},
		{"each text cut", history.Entry{Key: "t1:2", Approach: long("a", 3000), Summary: long("é", 5000), Error: long("e", 1<<20)},
			history.Entry{Key: "t1:2",
				Approach: textcut.Cut(long("a", 3000), history.MaxApproach),
				Summary:  long("é", 1010) + "… [cut: 7,980 bytes more]",
				Error:    long("e", 2017) + "… [cut: 1,046,559 bytes more]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in.Capped()
			if got != tt.want {
				t.Fatalf("Capped = %+v\nwant %+v", got, tt.want)
			}
			if len(got.Approach) > history.MaxApproach || len(got.Summary) > history.MaxSummary || len(got.Error) > history.MaxError {
				t.Fatalf("Capped kept %d/%d/%d bytes", len(got.Approach), len(got.Summary), len(got.Error))
			}
			if got.Capped() != got {
				t.Fatal("Capped is not idempotent")
			}
		})
	}
}

// What the recorder appends (Record.Add, as dispatch rebuild) is capped,
// the oldest dropped first past Keep, and appending it again changes
// nothing.
func TestRecordAddCapsAndKeepsTheNewest(t *testing.T) {
	at := time.Date(2026, 5, 18, 14, 22, 0, 0, time.UTC)
	var rec history.Record
	for i := range history.Keep + 2 {
		e := history.Entry{Key: "t1:" + string(rune('a'+i)), TaskID: "t1", Attempt: i + 1, Outcome: events.OutcomeFailure,
			Approach: "try " + string(rune('a'+i)), Summary: strings.Repeat("s", 1<<20), Error: strings.Repeat("e", 1<<20),
			At: at.Add(time.Duration(i) * time.Minute)}
		var changed bool
		if rec, changed = rec.Add(e); !changed {
			t.Fatalf("entry %d not added", i)
		}
		if _, changed = rec.Add(e); changed {
			t.Fatalf("entry %d added twice", i)
		}
	}
	for _, kind := range [][]history.Entry{rec.Outcomes, rec.Failures} {
		if len(kind) != history.Keep || kind[0].Approach != "try c" || kind[history.Keep-1].Approach != "try g" {
			t.Fatalf("kept %d entries from %q, want the newest %d", len(kind), kind[0].Approach, history.Keep)
		}
		for _, e := range kind {
			if len(e.Summary) > history.MaxSummary || len(e.Error) > history.MaxError || !strings.HasSuffix(e.Error, " bytes more]") {
				t.Fatalf("entry %s keeps %d bytes of summary, %d of error", e.Key, len(e.Summary), len(e.Error))
			}
		}
	}
}
