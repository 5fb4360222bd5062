package services

import (
	"context"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// A republish answered as a duplicate is read back and found to be the
// router's own on every stream the services publish to: the task stream,
// the trust outcomes and the spend counters (a counter stream answers a
// duplicate too, and keeps each increment with its Msg-Id).
func TestStoredAsOnEveryStream(t *testing.T) {
	s := natstest.Start(t)
	ctx := context.Background()
	if _, err := Provision(ctx, s.JS, StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	r := &Router{JS: s.JS}
	event, err := Emit(events.TaskSubject("t1", "out"), "t1:1:out", "test.v1", "t1", "x")
	if err != nil {
		t.Fatal(err)
	}
	outcome, err := trust.OutcomeMsg("css_fix", trust.Outcome{Key: "t1:1:executed", Success: true, At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	spend, err := trust.SpendMsgs("css_fix", "t1:1:executed", time.Now(), 120, 0.01)
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []Out{event, OutMsg(outcome), OutMsg(spend[0])} {
		for i, wantDup := range []bool{false, true} {
			dup, err := r.publishAck(ctx, "test", out)
			if err != nil || dup != wantDup {
				t.Fatalf("%s, publish %d: duplicate %v, %v; want %v, nil", out.Subject, i+1, dup, err, wantDup)
			}
		}
	}
}
