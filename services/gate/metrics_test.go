package gate_test

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/metricstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/gate"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// The trust score and the outcomes in the window are read from the gate's
// view at each scrape, each type under its own policy: a type too new to
// be scored reports its outcomes and no score, a type with gate facts and
// no outcome reports 0 outcomes, and nothing needs a decision first — a
// gate started later (a restart, another instance) reports the same.
func TestTrustGaugesAreReadAtEachScrape(t *testing.T) {
	exempt := true
	pol := &policy.File{Types: map[string]policy.Type{"triage_fix": {Exempt: &exempt}}}
	e := newEnv(t, pol)
	e.outcomes("css_fix", 12, 9, "")    // scored
	e.outcomes("new_fix", 9, 9, "")     // one short of being scored
	e.outcomes("triage_fix", 10, 0, "") // exempt: still scored
	if _, err := e.trust.Canary(context.Background(), "idle_fix", "c0", now, trust.Policy{}.WithDefaults(), trust.Stats{}); err != nil {
		t.Fatal(err) // gate facts only: a canary place, no outcome
	}
	waitFacts(t, e.view, "idle_fix")

	scrape := func() (map[string]float64, map[string]float64) {
		reg := prometheus.NewPedanticRegistry()
		if _, err := gate.New(gate.Config{View: e.view, Trust: e.trust, Policy: policy.Static(pol), Registry: reg, Log: quiet}); err != nil {
			t.Fatal(err)
		}
		return metricstest.Family(t, reg, "dispatch_trust_score"), metricstest.Family(t, reg, "dispatch_trust_outcomes")
	}
	score, outcomes := scrape()
	cssScore, _, _ := trust.Score(e.view.Stats("css_fix").Outcomes, trust.Policy{})
	if want := map[string]float64{"type=css_fix": cssScore, "type=triage_fix": 0}; !maps.Equal(score, want) {
		t.Errorf("dispatch_trust_score = %v, want %v", score, want)
	}
	if want := map[string]float64{"type=css_fix": 12, "type=new_fix": 9, "type=triage_fix": 10, "type=idle_fix": 0}; !maps.Equal(outcomes, want) {
		t.Errorf("dispatch_trust_outcomes = %v, want %v", outcomes, want)
	}

	// One more outcome of new_fix: scored at the next scrape, no decision needed.
	e.outcomes("new_fix", 1, 1, "late")
	score, outcomes = scrape()
	if score["type=new_fix"] != 1 || outcomes["type=new_fix"] != 10 {
		t.Errorf("new_fix after its tenth outcome: score %v, outcomes %v; want 1 and 10", score["type=new_fix"], outcomes["type=new_fix"])
	}
}

// The gate's scoring defaults are the collector's too: a window of 5 and
// 3 outcomes to be scored.
func TestTrustGaugesFollowTheGatesScoring(t *testing.T) {
	e := newEnv(t, nil)
	e.outcomes("css_fix", 8, 8, "")
	e.outcomes("new_fix", 2, 2, "")
	reg := prometheus.NewPedanticRegistry()
	if _, err := gate.New(gate.Config{View: e.view, Trust: e.trust, Scoring: trust.Policy{Window: 5, MinOutcomes: 3}, Registry: reg, Log: quiet}); err != nil {
		t.Fatal(err)
	}
	if got, want := metricstest.Family(t, reg, "dispatch_trust_outcomes"), map[string]float64{"type=css_fix": 5, "type=new_fix": 2}; !maps.Equal(got, want) {
		t.Errorf("dispatch_trust_outcomes = %v, want %v", got, want)
	}
	if got, want := metricstest.Family(t, reg, "dispatch_trust_score"), map[string]float64{"type=css_fix": 1}; !maps.Equal(got, want) {
		t.Errorf("dispatch_trust_score = %v, want %v", got, want)
	}
}

// Past the type label's limit a type the policy does not name has no
// trust series (a score cannot be summed into "other"); a named type
// always has them.
func TestTrustGaugesKeepToTheLabelLimit(t *testing.T) {
	pol := policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": {}}})
	e := newEnv(t, nil)
	for _, typ := range []string{"a_fix", "b_fix", "c_fix", "css_fix"} {
		e.outcomes(typ, 10, 10, "")
	}
	waitFacts(t, e.view, "css_fix")
	reg := prometheus.NewPedanticRegistry()
	if _, err := gate.New(gate.Config{View: e.view, Trust: e.trust, Policy: pol, TypeLabels: services.NewLabelSet(1, pol.Names), Registry: reg, Log: quiet}); err != nil {
		t.Fatal(err)
	}
	got := metricstest.Family(t, reg, "dispatch_trust_outcomes")
	if len(got) != 2 || got["type=css_fix"] != 10 {
		t.Errorf("dispatch_trust_outcomes = %v, want css_fix and one other type", got)
	}
	if _, ok := got["type="+services.LabelOther]; ok {
		t.Errorf("dispatch_trust_outcomes has a type=other series: %v", got)
	}
}

func waitFacts(t *testing.T, v *trust.View, taskType string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !slices.ContainsFunc(v.All(), func(s trust.Stats) bool { return s.Type == taskType }) {
		if time.Now().After(deadline) {
			t.Fatalf("the view never saw the gate facts of %s", taskType)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Under the router, a decision is counted once per pass: a pass that
// waited for its type's canaries (snoozed: redelivered) counts when it is
// admitted, and a pass whose decision was already stored (its first
// delivery published it, then died before the ack) counts nothing again.
func TestGateCountsEachDecisionOnce(t *testing.T) {
	one := 1
	pol := policy.Static(&policy.File{Types: map[string]policy.Type{"careful": {Canary: &one}}})
	e := newEnv(t, nil)
	reg := prometheus.NewPedanticRegistry()
	g, err := gate.New(gate.Config{View: e.view, Trust: e.trust, Tasks: e.tasks, Policy: pol, Registry: reg, Log: quiet, Instance: "gate@test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	m := services.NewMetrics(reg)
	r := &services.Router{JS: e.js, Instance: "gate@test", Log: quiet, Grace: 10 * time.Second, Metrics: m}
	rh := &services.Router{JS: e.js, Instance: "gate@test", Log: quiet, Grace: 10 * time.Second, Metrics: m}
	heldDone := make(chan error, 1)
	go func() { done <- r.Run(ctx, g.Spec()) }()
	go func() { heldDone <- rh.Run(ctx, g.HeldSpec()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
		if err := <-heldDone; err != nil {
			t.Errorf("held router: %v", err)
		}
	})
	verified := func(id string) events.Base {
		b := events.Base{Task: events.Task{ID: id, Type: "careful", Subject: id + ".go", SubmittedAt: time.Now()}, Run: events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}}
		if _, _, err := e.tasks.Create(context.Background(), task.New(b.Task)); err != nil {
			t.Fatal(err)
		}
		out, err := services.Next(b, events.StageVerified, events.EventVerified, events.Verified{Base: b})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.PublishMsg(context.Background(), services.NatsMsg(out), jetstream.WithMsgID(out.MsgID)); err != nil {
			t.Fatal(err)
		}
		return b
	}
	admitted := func(id string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if s, err := e.js.Stream(context.Background(), services.Stream); err == nil {
				if _, err := s.GetLastMsgForSubject(context.Background(), events.TaskSubject(id, events.StageAdmitted)); err == nil {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s was never admitted", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	verified("c0") // the one canary
	admitted("c0")
	verified("w1") // waits for c0
	waitCount(t, func() float64 { return metricstest.Family(t, reg, "dispatch_gate_waits_total")["type=careful"] }, 1)
	if _, err := e.tasks.Update(context.Background(), "c0", func(st *events.TaskState, _ bool) error {
		st.Status = events.StatusSucceeded // c0 ended: its place is free
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	admitted("w1")

	// d2's admission was stored by an earlier delivery that never acked.
	b := events.Base{Task: events.Task{ID: "d2", Type: "careful", Subject: "d2.go"}, Run: events.Run{Pass: 1, Attempt: 1}}
	before, err := services.Next(b, events.StageAdmitted, events.EventAdmitted, events.Admitted{Base: b})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.PublishMsg(context.Background(), services.NatsMsg(before), jetstream.WithMsgID(before.MsgID)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.trust.Release(context.Background(), "careful", "w1"); err != nil {
		t.Fatal(err) // w1's place is free too
	}
	// Once the gate's view shows every place free: else d2 would be parked
	// in the held consumer (every place taken, as far as the view knows)
	// and its admission republished from there. Not "w1's place gone": a
	// view that has not yet applied w1's claim shows none of w1's, and
	// still shows c0's.
	waitCount(t, func() float64 {
		if len(e.view.Stats("careful").Canaries) > 0 {
			return 0
		}
		return 1
	}, 1)
	verified("d2")
	waitCount(t, func() float64 {
		return metricstest.Family(t, reg, "dispatch_published_total")["duplicate=true,service="+services.ConsumerGate]
	}, 1)
	waitConsumerIdle(t, e.js, services.ConsumerGate)

	// Labels in name order: cause, type.
	if got, want := metricstest.Family(t, reg, "dispatch_gate_decisions_total"), map[string]float64{"cause=unproven,type=careful": 2}; !maps.Equal(got, want) {
		t.Errorf("dispatch_gate_decisions_total = %v, want %v (c0 and w1 once each; d2 was counted when its decision was first stored)", got, want)
	}
	if got := metricstest.Family(t, reg, "dispatch_redeliveries_total")["service="+services.ConsumerGateHeld]; got < 1 {
		t.Errorf("dispatch_redeliveries_total{service=gate_held} = %v, want w1's looks", got)
	}
}

func waitCount(t *testing.T, get func() float64, want float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for get() < want {
		if time.Now().After(deadline) {
			t.Fatalf("count %v never reached %v", get(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitConsumerIdle(t *testing.T, js jetstream.JetStream, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := js.Consumer(context.Background(), services.StreamOf(name), name)
		if err == nil {
			if ci, err := c.Info(context.Background()); err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s never idle", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
