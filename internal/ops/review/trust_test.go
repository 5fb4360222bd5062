package review_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/trust"
)

// A type's trust view counts successes and failures in the scoring window,
// as its score does, not every outcome the stream keeps: 100 old
// successes, then 20 failures, leave 30 and 20 in a window of 50.
func TestTrustCountsTheWindow(t *testing.T) {
	s := newSeeded(t)
	for i := range 120 {
		msg, err := trust.OutcomeMsg("css_fix", trust.Outcome{Key: fmt.Sprintf("k%03d", i), Success: i < 100, At: s.now.Add(time.Duration(i) * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.srv.JS.PublishMsg(bg, msg); err != nil {
			t.Fatal(err)
		}
	}
	tv, err := s.rc.TrustOf(bg, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	if tv.Outcomes != trust.DefaultWindow || tv.Successes != 30 || tv.Failures != 20 {
		t.Fatalf("outcomes %d, successes %d, failures %d; want 50, 30, 20", tv.Outcomes, tv.Successes, tv.Failures)
	}
}
