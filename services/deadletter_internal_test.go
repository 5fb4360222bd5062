package services

import (
	"errors"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Outputs that could not be published are retried with backoff, as
// before this was middleware, even at shutdown.
func TestDecidePublishFailure(t *testing.T) {
	spec := Spec{MaxDeliver: 3, Backoff: func(n int) time.Duration { return time.Duration(n) * time.Second }}.withDefaults()
	perr := &publishError{subject: "dispatch.task.t1.out", err: errors.New("timeout")}
	for _, c := range []struct {
		delivered int
		want      Fate
	}{
		{1, Fate{Action: ActionNak, Delay: time.Second, Result: ResultRetried}},
		{3, Fate{Action: ActionTerm, Reason: events.ReviewPoison, Result: ResultDead}},
	} {
		f, _, _ := decide(spec, &Msg{Delivered: c.delivered}, perr, true)
		if f.Action != c.want.Action || f.Delay != c.want.Delay || f.Reason != c.want.Reason || f.Result != c.want.Result || !errors.Is(f.Err, perr) {
			t.Errorf("delivery %d: fate %+v, want %+v", c.delivered, *f, c.want)
		}
	}
}
