package gate

import (
	"testing"
	"time"
)

// A pass woken again and again is woken less and less often: 5s, 10s,
// 20s … up to MaxRewake.
func TestRewakeBacksOff(t *testing.T) {
	at := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		n     int
		after time.Duration
	}{{1, Rewake}, {2, 2 * Rewake}, {3, 4 * Rewake}, {7, MaxRewake}, {40, MaxRewake}} {
		w := woken{at: at, n: tt.n}
		if w.due(at.Add(tt.after - time.Millisecond)) {
			t.Errorf("woken %d times: due again before %s", tt.n, tt.after)
		}
		if !w.due(at.Add(tt.after)) {
			t.Errorf("woken %d times: not due again after %s", tt.n, tt.after)
		}
	}
}
