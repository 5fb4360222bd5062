package executor

import (
	"reflect"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

func TestCapResult(t *testing.T) {
	big := func(n int) string { return strings.Repeat("x", n) }
	small := events.Result{Outcome: events.OutcomeSuccess, Approach: "a", Summary: "s", Changes: []string{"c"}, Model: "gpt-4o",
		TokensIn: 10, TokensOut: 5, Cost: 0.01, RequestHash: "sha256:abc"}
	tests := []struct {
		name string
		in   events.Result
		c    caps
		want events.Result
	}{
		{"within the caps", small, answerCaps, small},
		{"every text over", events.Result{
			Outcome: events.OutcomeFailure, Approach: big(3 << 10), Summary: big(9 << 10), Error: big(1 << 20),
			Changes: []string{big(600), "b"}, Model: big(300), TokensIn: 7, ErrorClass: events.ErrorClassTask,
		}, answerCaps, events.Result{
			Outcome: events.OutcomeFailure, Approach: textcut.Cut(big(3<<10), events.MaxApproach),
			Summary: textcut.Cut(big(9<<10), events.MaxSummary), Error: textcut.Cut(big(1<<20), events.MaxError),
			Changes: []string{textcut.Cut(big(600), events.MaxChange), "b"}, Model: textcut.Cut(big(300), maxModelName),
			TokensIn: 7, ErrorClass: events.ErrorClassTask,
		}},
		{"too many changes", events.Result{Changes: strings.Fields(strings.Repeat("c ", 40))}, answerCaps,
			events.Result{Changes: append(strings.Fields(strings.Repeat("c ", 31)), "… [cut: 9 more entries, 9 bytes]")}},
		{"tight", events.Result{Approach: big(1000), Summary: big(2000), Error: big(2000), Changes: strings.Fields(strings.Repeat("c ", 10))},
			tightCaps, events.Result{Approach: textcut.Cut(big(1000), 512), Summary: textcut.Cut(big(2000), 1<<10),
				Error: textcut.Cut(big(2000), 1<<10), Changes: append(strings.Fields(strings.Repeat("c ", 7)), "… [cut: 3 more entries, 3 bytes]")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := capResult(tt.in, tt.c)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("capResult = %+v\nwant %+v", got, tt.want)
			}
			if again := capResult(got, tt.c); !reflect.DeepEqual(again, got) {
				t.Fatalf("capResult is not idempotent")
			}
		})
	}
}
