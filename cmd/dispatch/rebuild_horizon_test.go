package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// The stream's oldest events age out (DISPATCH_MAX_AGE) while the history,
// the trust outcomes and the task states they led to stay: rebuild reports
// no difference for what it cannot replay, and -apply keeps it.
func TestRebuildAfterEventsAgeOut(t *testing.T) {
	m := reviewtest.Start(t, func(_ int, r openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Failure("an idea", "nope")}
	}, reviewtest.Options{Policy: &policy.File{Types: map[string]policy.Type{"triage_fix": {MaxRetries: 1}}}})
	c := newCLI(t, m)
	for i := range 12 {
		id := fmt.Sprintf("old-%d", i)
		m.Submit(events.Submit{ID: id, Type: "triage_fix", Subject: fmt.Sprintf("f%d.css", i)})
		m.WaitStage(id, "review."+events.ReviewEscalated, 1)
	}
	ctx := context.Background()
	outcomes := func() int {
		v, err := trust.NewView(ctx, m.Srv.JS, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer v.Stop()
		return len(v.Stats("triage_fix").Outcomes)
	}
	before := outcomes()
	s, err := m.Srv.JS.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// what MaxAge does: the oldest two thirds go, from the front
	if err := s.Purge(ctx, jetstream.WithPurgeSequence(info.State.FirstSeq+info.State.Msgs*2/3)); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("rebuild"); !strings.Contains(out, "agree") {
		t.Fatalf("rebuild after the oldest events aged out:\n%s", out)
	}
	c.ok("rebuild", "-apply")
	if after := outcomes(); after != before {
		t.Fatalf("-apply left %d trust outcomes of %d", after, before)
	}
	if st := m.State("old-0"); st.Status != events.StatusBlocked || st.Attempts != 1 {
		t.Fatalf("the oldest task after -apply: %+v", st)
	}
}
