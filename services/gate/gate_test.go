package gate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/gate"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

var now = time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)

type env struct {
	t     *testing.T
	gate  *gate.Service
	js    jetstream.JetStream
	view  *trust.View
	trust *trust.Store
	spend *trust.Spending
	tasks *services.TaskStore
	index *services.HeldIndex
	later time.Duration // how far past now the gate's clock is
}

func newEnv(t *testing.T, pol *policy.File) *env {
	t.Helper()
	srv := natstest.Start(t)
	stores, err := services.Provision(context.Background(), srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, js: srv.JS, trust: trust.NewStore(stores.Trust, trust.Policy{}), tasks: services.NewTaskStore(stores.Tasks),
		spend: trust.NewSpending(srv.JS, services.CounterStream)}
	if e.view, err = trust.NewView(t.Context(), srv.JS, stores.Trust, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.view.Stop)
	e.index = services.NewHeldIndex(stores.Held)
	e.gate, err = gate.New(gate.Config{View: e.view, Trust: e.trust, Spending: e.spend, Tasks: e.tasks, Held: e.index, JS: srv.JS,
		Policy: policy.Static(pol), Instance: "gate@test", Now: func() time.Time { return now.Add(e.later) }})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// outcomes records n outcomes of typ, as the recorder publishes them: the
// first successes succeed. Without rung each is a task of one attempt that
// ended; with rung each is a retry on rung of a task still climbing its
// ladder. It returns once the gate's view holds them.
func (e *env) outcomes(typ string, n, successes int, rung events.Rung) {
	e.t.Helper()
	var all []trust.Outcome
	for i := range n {
		key := fmt.Sprintf("%s-%s-%d", typ, rung, i)
		o := trust.Outcome{Key: key, Task: key, Success: i < successes, At: now.Add(-time.Hour), Rung: rung, Retry: rung != "", End: rung == ""}
		if rung != "" && o.Success {
			o.End = true // a retry that succeeded ended its task
		}
		all = append(all, o)
	}
	e.publish(typ, all...)
}

// canaries is how many canaries an unproven type sends at once in a mesh
// that knows no other type: one round, MinOutcomes.
var canaries = trust.Policy{}.WithDefaults().Canary

// publish publishes outcomes of typ as the recorder does and returns once
// the gate's view holds them.
func (e *env) publish(typ string, outcomes ...trust.Outcome) {
	e.t.Helper()
	before, n := len(e.view.Stats(typ).Outcomes), len(outcomes)
	for _, o := range outcomes {
		m, err := trust.OutcomeMsg(typ, o)
		if err != nil {
			e.t.Fatal(err)
		}
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			e.t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(e.view.Stats(typ).Outcomes) < before+n {
		if time.Now().After(deadline) {
			e.t.Fatalf("the view never saw the %d outcomes of %s", n, typ)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// state stores st as the task's state (before its pass).
func (e *env) state(st events.TaskState) {
	e.t.Helper()
	if _, err := e.tasks.Update(context.Background(), st.ID, func(cur *events.TaskState, _ bool) error { *cur = st; return nil }); err != nil {
		e.t.Fatal(err)
	}
}

// pass runs one verified pass through the gate: the stage or review reason
// it went to and its decision, or the snooze.
func (e *env) pass(id, typ string, run events.Run, waited time.Duration) (to string, d events.TrustDecision, err error) {
	e.t.Helper()
	b := events.Base{Task: events.Task{ID: id, Type: typ, Subject: id + ".go"}, Run: run}
	if _, _, err := e.tasks.Create(context.Background(), task.New(b.Task)); err != nil {
		e.t.Fatal(err)
	}
	data, _ := json.Marshal(events.Verified{Base: b})
	outs, err := e.gate.Handle(context.Background(), &services.Msg{
		Subject: events.TaskSubject(id, events.StageVerified), Data: data, Delivered: 1, Time: now.Add(-waited),
	})
	if err != nil {
		return "", d, err
	}
	outs = records(outs)
	if len(outs) != 1 {
		e.t.Fatalf("%d outputs", len(outs))
	}
	var ev struct {
		Trust events.TrustDecision `json:"trust"`
		Cause events.Cause         `json:"cause"`
		Run   events.Run           `json:"run"`
	}
	if err := json.Unmarshal(outs[0].Data, &ev); err != nil {
		e.t.Fatal(err)
	}
	if ev.Cause != "" {
		ev.Trust.Cause = ev.Cause
	}
	if reason, _, ok := events.ParseReviewSubject(outs[0].Subject); ok {
		return reason, ev.Trust, nil
	}
	_, stage, _ := events.ParseTaskSubject(outs[0].Subject)
	return stage, ev.Trust, nil
}

// records drops the outcome messages (a handoff's end marker) from outs.
func records(outs []services.Out) []services.Out {
	return slices.DeleteFunc(slices.Clone(outs), func(o services.Out) bool {
		return strings.HasPrefix(o.Subject, trust.OutcomeRoot+".")
	})
}

func first() events.Run                 { return events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine} }
func retry(rung events.Rung) events.Run { return events.Run{Pass: 3, Attempt: 3, Rung: rung} }

func TestGateDecisions(t *testing.T) {
	exempt := true
	pol := &policy.File{Types: map[string]policy.Type{
		"triage_fix": {Exempt: &exempt},
		"spendy":     {DailyBudget: &policy.Budget{Tokens: 10}},
	}}
	tests := []struct {
		name  string
		setup func(e *env)
		id    string
		typ   string
		run   events.Run
		to    string
		cause events.Cause
	}{
		{"a trusted type", func(e *env) { e.outcomes("css_fix", 10, 8, "") }, "a", "css_fix", first(), events.StageAdmitted, events.CauseTrusted},
		{"an unproven type sends a canary", nil, "b", "css_fix", first(), events.StageAdmitted, events.CauseUnproven},
		{"a collapsed type holds a new task", func(e *env) { e.outcomes("css_fix", 10, 0, "") }, "c", "css_fix", first(), events.StageHeld, events.CauseTrust},
		{"a collapsed type holds a ladder in flight", func(e *env) { e.outcomes("css_fix", 10, 0, "") }, "d", "css_fix", retry(events.RungPivot), events.StageHeld, events.CauseTrust},
		{"a regression holds a new task", func(e *env) {
			e.outcomes("css_fix", 30, 30, "")
			e.publish("css_fix", trust.Outcome{Key: "r1", Task: "r1", End: true, At: now}, trust.Outcome{Key: "r2", Task: "r2", End: true, At: now})
		}, "c2", "css_fix", first(), events.StageHeld, events.CauseTrust},
		{"a hard task climbing its ladder does not stop its type", func(e *env) {
			e.outcomes("css_fix", 12, 12, "")
			var ladder []trust.Outcome
			for i := range 7 {
				ladder = append(ladder, trust.Outcome{Key: fmt.Sprintf("hard:%d:outcome", i+1), Task: "hard", Retry: i > 0, Rung: events.RungRefine, At: now, End: i == 6})
			}
			e.publish("css_fix", ladder...)
		}, "c3", "css_fix", first(), events.StageAdmitted, events.CauseTrusted},
		{"an exempt type goes", func(e *env) { e.outcomes("triage_fix", 10, 0, "") }, "e", "triage_fix", retry(events.RungPivot), events.StageAdmitted, events.CauseExempt},
		{"a human's requeue goes", func(e *env) { e.outcomes("css_fix", 10, 0, "") }, "f", "css_fix", events.Run{Pass: 5, Attempt: 5, Reviewed: true}, events.StageAdmitted, events.CauseReviewed},
		{"a probe's retry goes on", func(e *env) { e.outcomes("css_fix", 10, 0, "") }, "g", "css_fix", events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine, Probe: true}, events.StageAdmitted, events.CauseProbe},
		{"a type over its daily budget", func(e *env) {
			if err := e.spend.Add(context.Background(), "spendy", "x", now, 50, 0); err != nil {
				t.Fatal(err)
			}
		}, "h", "spendy", first(), events.ReviewGated, events.CauseBudget},
		{"a human's requeue goes past a spent daily budget", func(e *env) {
			if err := e.spend.Add(context.Background(), "spendy", "x", now, 50, 0); err != nil {
				t.Fatal(err)
			}
			e.state(events.TaskState{ID: "h2", Type: "spendy", Status: events.StatusPending, Attempts: 4, RoundStart: 4, Pass: 5})
		}, "h2", "spendy", events.Run{Pass: 5, Attempt: 5, Reviewed: true}, events.StageAdmitted, events.CauseReviewed},
		{"a retry in the round a requeue started does not", func(e *env) {
			if err := e.spend.Add(context.Background(), "spendy", "x", now, 50, 0); err != nil {
				t.Fatal(err)
			}
			e.state(events.TaskState{ID: "h3", Type: "spendy", Status: events.StatusPending, Attempts: 5, RoundStart: 4, Pass: 6})
		}, "h3", "spendy", events.Run{Pass: 6, Attempt: 6, Reviewed: true}, events.ReviewGated, events.CauseBudget},
		{"a retry is handed off when its rung and those above rarely succeed", func(e *env) {
			e.outcomes("css_fix", 20, 20, "")
			e.outcomes("css_fix", 9, 1, events.RungPivot)
			e.outcomes("css_fix", 8, 0, events.RungResearch)
		}, "i", "css_fix", retry(events.RungPivot), events.ReviewEscalated, events.CauseRungRate},
		{"a retry's first climb on a type's thin data weighs its other rungs", func(e *env) {
			e.outcomes("css_fix", 20, 20, "")
			e.outcomes("css_fix", 6, 0, events.RungRefine)
			e.outcomes("css_fix", 6, 0, events.RungPivot)
		}, "i2", "css_fix", retry(events.RungPivot), events.ReviewEscalated, events.CauseRungRate},
		{"a retry onto a rung that succeeds often enough goes", func(e *env) {
			e.outcomes("css_fix", 20, 20, "")
			e.outcomes("css_fix", 9, 5, events.RungPivot)
		}, "j", "css_fix", retry(events.RungPivot), events.StageAdmitted, events.CauseTrusted},
		{"the rung floor weighs retries only", func(e *env) {
			e.outcomes("css_fix", 20, 20, "")
			e.outcomes("css_fix", 9, 0, events.RungRefine)
		}, "k", "css_fix", first(), events.StageAdmitted, events.CauseTrusted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, pol)
			if tt.setup != nil {
				tt.setup(e)
			}
			to, d, err := e.pass(tt.id, tt.typ, tt.run, 0)
			if err != nil {
				t.Fatal(err)
			}
			if to != tt.to || d.Cause != tt.cause {
				t.Fatalf("went to %s with cause %q (%s), want %s, %s", to, d.Cause, d.Reason, tt.to, tt.cause)
			}
		})
	}
}

// A burst of an unproven type: the canaries go, the rest wait unspent until
// an outcome frees a place, and a pass that waited past the canary TTL goes.
func TestGateCanaries(t *testing.T) {
	e := newEnv(t, nil)
	for i := range canaries {
		if to, _, err := e.pass(fmt.Sprintf("c%d", i), "new_type", first(), 0); err != nil || to != events.StageAdmitted {
			t.Fatalf("canary %d: %s %v", i, to, err)
		}
	}
	// The next waits in the held consumer, not in the verified one.
	if to, d, err := e.pass("w1", "new_type", first(), 0); err != nil || to != events.StageHeld || d.Cause != events.CauseUnproven {
		t.Fatalf("the pass after the canaries: %s %+v %v; want held, unproven", to, d, err)
	}
	// A look at it while the canaries run leaves it asleep in the held
	// index, waiting for canaries: no consumer keeps its message.
	if outs, err := e.held("w1", "new_type", first(), events.HoldCanary, 0, 1); !e.asleep("w1", 1, outs, err) {
		t.Fatalf("a look at it while the canaries run: %d outputs, %v; want asleep in the held index", len(outs), err)
	}
	if keys := e.asleepKeys(); len(keys) != 1 {
		t.Fatalf("held index %v, want w1's entry alone", keys)
	} else if raw, err := e.index.KV().Get(context.Background(), keys[0]); err != nil {
		t.Fatal(err)
	} else if entry, err := services.DecodeHeldEntry(keys[0], raw.Value()); err != nil || !entry.Canary() {
		t.Fatalf("w1's entry %+v (%v), want one waiting for canaries", entry, err)
	}
	if st, _ := e.tasks.Get(context.Background(), "w1"); st.Status != events.StatusPending {
		t.Fatalf("a waiting task is %s", st.Status)
	}
	// A canary keeps its place for its retries until it ends.
	if to, _, err := e.pass("c1", "new_type", events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine}, 0); err != nil || to != events.StageAdmitted {
		t.Fatalf("a canary's retry: %s %v", to, err)
	}
	// c0 ends: its place is free for the next pass that asks.
	e.publish("new_type", trust.Outcome{Key: "c0:1:outcome", Success: true, At: now})
	if _, err := e.tasks.Update(context.Background(), "c0", func(st *events.TaskState, _ bool) error {
		st.Status = events.StatusSucceeded
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if outs, err := e.held("w1", "new_type", first(), events.HoldCanary, 0, 3); err != nil || to(outs) != events.StageAdmitted {
		t.Fatalf("after an outcome: %s %v", to(outs), err)
	}
	if keys := e.asleepKeys(); len(keys) != 0 {
		t.Fatalf("held index %v after w1 was admitted, want empty", keys)
	}
	if to, d, err := e.pass("w2", "new_type", first(), trust.DefaultCanaryTTL); err != nil || to != events.StageAdmitted || !strings.Contains(d.Reason, "waited") {
		t.Fatalf("a pass that waited the whole TTL: %s %+v %v", to, d, err)
	}
}

// A type's own canary setting is the one the gate applies: one canary at a
// time for "careful", none at all (every pass goes) for "eager".
func TestGateCanariesPerType(t *testing.T) {
	one, none := 1, 0
	e := newEnv(t, &policy.File{Types: map[string]policy.Type{
		"careful": {Canary: &one},
		"eager":   {Canary: &none},
	}})
	if to, _, err := e.pass("c0", "careful", first(), 0); err != nil || to != events.StageAdmitted {
		t.Fatalf("careful's canary: %s %v", to, err)
	}
	if to, _, err := e.pass("c1", "careful", first(), 0); err != nil || to != events.StageHeld {
		t.Fatalf("careful's second pass went to %s while its one canary runs: %v", to, err)
	}
	for i := range canaries + 2 {
		if to, _, err := e.pass(fmt.Sprintf("e%d", i), "eager", first(), 0); err != nil || to != events.StageAdmitted {
			t.Fatalf("eager pass %d (no canaries): %s %v", i, to, err)
		}
	}
}

// Blocks of new tasks build the streak; the next new task is a probe and
// is marked so its retries go on. Stopped retries do not count.
func TestGateProbeAfterBlocks(t *testing.T) {
	e := newEnv(t, nil)
	e.outcomes("css_fix", 10, 0, "")
	for i := range 3 {
		if to, _, _ := e.pass(fmt.Sprintf("r%d", i), "css_fix", retry(events.RungPivot), 0); to != events.StageHeld {
			t.Fatalf("retry %d went to %s", i, to)
		}
	}
	for i := range trust.DefaultProbeAfter {
		if to, _, _ := e.pass(fmt.Sprintf("n%d", i), "css_fix", first(), 0); to != events.StageHeld {
			t.Fatalf("new task %d went to %s", i, to)
		}
	}
	to, d, err := e.pass("probe", "css_fix", first(), 0)
	if err != nil || to != events.StageAdmitted || !d.Probe || d.Cause != events.CauseProbe {
		t.Fatalf("the probe: %s %+v %v", to, d, err)
	}
}

// A type's own trust numbers: a window of 5 scored from 3 outcomes, gated
// below 0.5 with the plain rate only, a probe after 2 blocks — while
// another type keeps the defaults.
func TestGateTrustNumbersPerType(t *testing.T) {
	half, one, zero := 0.5, 1.0, 0.0
	e := newEnv(t, &policy.File{Types: map[string]policy.Type{
		"strict": {TrustWindow: 5, MinOutcomes: 3, ProbeAfter: 2, Threshold: &half, OverallWeight: &one, RecencyWeight: &zero},
	}})
	// 20 successes, then 3 failures: the last 5 hold 2 successes (0.4);
	// the other type's failures came first.
	for _, typ := range []string{"strict", "lenient"} {
		var all []trust.Outcome
		for i := range 23 {
			success := i < 20
			if typ == "lenient" {
				success = i >= 3
			}
			all = append(all, trust.Outcome{Key: fmt.Sprintf("%s-%02d", typ, i), Success: success, End: true, At: now.Add(time.Duration(i-60) * time.Minute)})
		}
		e.publish(typ, all...)
	}
	for i := range 2 {
		to, d, err := e.pass(fmt.Sprintf("s%d", i), "strict", first(), 0)
		if err != nil || to != events.StageHeld || d.Outcomes != 5 || d.Score != 0.4 {
			t.Fatalf("strict pass %d: %s %+v %v; want held, 5 outcomes scored 0.4", i, to, d, err)
		}
	}
	if to, d, err := e.pass("s-probe", "strict", first(), 0); err != nil || to != events.StageAdmitted || !d.Probe {
		t.Fatalf("strict's third new task: %s %+v %v; want the probe after 2 blocks", to, d, err)
	}
	if to, d, err := e.pass("l0", "lenient", first(), 0); err != nil || to != events.StageAdmitted || d.Outcomes != 23 {
		t.Fatalf("lenient: %s %+v %v; want admitted on its default window", to, d, err)
	}
}

// A retry stopped for its type's trust is held, its state kept; held past
// the hold time it goes to review with what it tried.
func TestHeldRetryGoesToReviewAfterTheHoldTime(t *testing.T) {
	e := newEnv(t, nil)
	e.outcomes("css_fix", 10, 0, "")
	ctx := context.Background()
	b := events.Base{Task: events.Task{ID: "tried", Type: "css_fix", Subject: "a.css"}, Run: retry(events.RungPivot)}
	st := task.New(b.Task)
	st.History = []events.AttemptRecord{{Attempt: 1, Pass: 1, Outcome: events.OutcomeFailure, Reason: "no"}, {Attempt: 2, Pass: 2, Outcome: events.OutcomeFailure, Reason: "still no"}}
	if _, _, err := e.tasks.Create(ctx, st); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(events.Verified{Base: b})
	outs, err := e.gate.Handle(ctx, &services.Msg{Subject: events.TaskSubject("tried", events.StageVerified), Data: data, Delivered: 1, Time: now})
	if err != nil || to(outs) != events.StageHeld {
		t.Fatalf("the retry went to %s (%v), want held", to(outs), err)
	}
	if st, _ := e.tasks.Get(ctx, "tried"); st.Status != events.StatusHeld || !strings.HasPrefix(st.Reason, "Blocked: css_fix trust score") {
		t.Fatalf("status %s (%q), want held with the gate's reason", st.Status, st.Reason)
	}
	// Looked at within the hold time, the type having just failed (no
	// probe due): it sleeps again.
	e.publish("css_fix", trust.Outcome{Key: "recent", End: true, At: now})
	if outs, err := e.held("tried", "css_fix", b.Run, events.HoldTrust, time.Hour, 2); !e.asleep("tried", b.Run.Pass, outs, err) {
		t.Fatalf("a look within the hold time: %d outputs, %v", len(outs), err)
	}
	// Past it: to a human, with what it tried.
	e.later = trust.DefaultHoldTime
	e.publish("css_fix", trust.Outcome{Key: "recent-again", End: true, At: now.Add(e.later)}) // no probe due
	outs, err = e.held("tried", "css_fix", b.Run, events.HoldTrust, time.Hour, 3)
	if err != nil || to(outs) != events.ReviewGated {
		t.Fatalf("past the hold time it went to %s (%v)", to(outs), err)
	}
	if keys := e.asleepKeys(); len(keys) != 0 {
		t.Fatalf("the hold ended, its entry stays: %v", keys)
	}
	var g events.Gated
	if err := json.Unmarshal(records(outs)[0].Data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Attempts) != 2 || g.Trust.Cause != events.CauseTrust {
		t.Fatalf("gated record: %+v", g)
	}
	if st, _ := e.tasks.Get(ctx, "tried"); st.Status != events.StatusNeedsHumanReview {
		t.Fatalf("status %s", st.Status)
	}
}

// Held tasks come back on their own: a probe of the held (one per probe
// interval however many look), and once a probe succeeded, the others — a
// few at a time until the type's score recovers.
func TestHeldTasksReadmittedWhenAProbeSucceeds(t *testing.T) {
	e := newEnv(t, nil)
	e.outcomes("css_fix", 10, 0, "")
	ctx := context.Background()
	for _, id := range []string{"h1", "h2", "h3", "h4"} {
		if to, _, err := e.pass(id, "css_fix", first(), 0); err != nil || to != events.StageHeld {
			t.Fatalf("%s went to %s (%v)", id, to, err)
		}
	}
	// The type's newest outcome is an hour old: the first look probes.
	outs, err := e.held("h1", "css_fix", first(), events.HoldTrust, time.Minute, 2)
	if err != nil || to(outs) != events.StageAdmitted {
		t.Fatalf("the first look went to %s (%v), want a probe", to(outs), err)
	}
	var a events.Admitted
	if err := json.Unmarshal(outs[0].Data, &a); err != nil || !a.Trust.Probe || !a.Run.Probe {
		t.Fatalf("the probe: %+v %v", a, err)
	}
	// A wake of h1 published before its admission was stored finds the
	// admission (its state still shows it held until the executor starts
	// it): dropped, not held again.
	if _, err := e.js.PublishMsg(ctx, services.NatsMsg(outs[0]), jetstream.WithMsgID(outs[0].MsgID)); err != nil {
		t.Fatal(err)
	}
	if outs, err := e.held("h1", "css_fix", first(), events.HoldTrust, time.Minute, 3); err != nil || len(outs) != 0 || e.asleep("h1", 1, nil, nil) {
		t.Fatalf("a late wake of an admitted pass: %d outputs, %v, asleep %v", len(outs), err, e.asleep("h1", 1, nil, nil))
	}
	// Another look in the same interval sleeps.
	if outs, err := e.held("h2", "css_fix", first(), events.HoldTrust, time.Minute, 2); !e.asleep("h2", 1, outs, err) {
		t.Fatalf("a second look in the interval: %d outputs, %v", len(outs), err)
	}
	// The probe succeeds: the type is open again, on probation — two of
	// the held come back at once, the third waits for one of them.
	e.publish("css_fix", trust.Outcome{Key: "h1:1:outcome", Task: "h1", Success: true, Probe: true, End: true, At: now})
	for _, id := range []string{"h2", "h3"} {
		if outs, err := e.held(id, "css_fix", first(), events.HoldTrust, time.Minute, 3); err != nil || to(outs) != events.StageAdmitted {
			t.Fatalf("after the probe's success %s went to %s (%v)", id, to(outs), err)
		}
	}
	if outs, err := e.held("h4", "css_fix", first(), events.HoldTrust, time.Minute, 3); !e.asleep("h4", 1, outs, err) {
		t.Fatalf("a third re-admission while two are on trial: %d outputs, %v", len(outs), err)
	}
	// h3 succeeds (its place is freed once it ended): four places now.
	e.publish("css_fix", trust.Outcome{Key: "h3:1:outcome", Task: "h3", Success: true, End: true, At: now})
	if _, err := e.tasks.Update(ctx, "h3", func(st *events.TaskState, _ bool) error { st.Status = events.StatusSucceeded; return nil }); err != nil {
		t.Fatal(err)
	}
	if outs, err := e.held("h4", "css_fix", first(), events.HoldTrust, time.Minute, 4); err != nil || to(outs) != events.StageAdmitted {
		t.Fatalf("after a success on trial h4 went to %s (%v)", to(outs), err)
	}
	// A held pass of a task a human requeued meanwhile is dropped.
	if _, err := e.tasks.Update(ctx, "h2", func(st *events.TaskState, _ bool) error { st.Pass = 4; return nil }); err != nil {
		t.Fatal(err)
	}
	if outs, err := e.held("h2", "css_fix", first(), events.HoldTrust, time.Minute, 5); err != nil || len(outs) != 0 {
		t.Fatalf("a held pass of a task that moved on: %d outputs, %v", len(outs), err)
	}
	// Every hold ended: h1 probed, h2 dropped, h3 and h4 re-admitted.
	if keys := e.asleepKeys(); len(keys) != 0 {
		t.Fatalf("entries left in the held index: %v", keys)
	}
}

// A gate handoff marks the task ended on its type's outcomes.
func TestHandoffPublishesTheEndMarker(t *testing.T) {
	e := newEnv(t, nil)
	e.outcomes("css_fix", 20, 20, "")
	e.outcomes("css_fix", 9, 1, events.RungPivot)
	e.outcomes("css_fix", 8, 0, events.RungResearch)
	b := events.Base{Task: events.Task{ID: "m", Type: "css_fix", Subject: "m.go"}, Run: retry(events.RungPivot)}
	if _, _, err := e.tasks.Create(context.Background(), task.New(b.Task)); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(events.Verified{Base: b})
	outs, err := e.gate.Handle(context.Background(), &services.Msg{Subject: events.TaskSubject("m", events.StageVerified), Data: data, Delivered: 1, Time: now})
	if err != nil || len(outs) != 2 || outs[0].Subject != trust.OutcomeSubject("css_fix") {
		t.Fatalf("%d outputs (%v), want the end marker then the record", len(outs), err)
	}
	o, err := trust.DecodeOutcome(outs[0].Data)
	if err != nil || !o.Marker || !o.End || o.Task != "m" || o.Key != "m:3:end" {
		t.Fatalf("the marker: %+v %v", o, err)
	}
}

// A retry whose rung rarely succeeds moves up to the next rung that earns
// its call (or has no data yet), instead of being handed off.
func TestGateMovesARetryUpTheLadder(t *testing.T) {
	e := newEnv(t, nil)
	e.outcomes("css_fix", 20, 20, "")
	e.outcomes("css_fix", 10, 0, events.RungRefine)
	e.outcomes("css_fix", 10, 9, events.RungPivot)
	to, d, err := e.pass("up", "css_fix", events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine}, 0)
	if err != nil || to != events.StageAdmitted || d.Rung != events.RungPivot || d.RungTries != 10 || d.RungSuccesses != 0 {
		t.Fatalf("went to %s with %+v (%v)", to, d, err)
	}
}

// A task a human cancelled before the gate takes no canary place and goes
// nowhere.
func TestCancelledTaskIsNotAdmitted(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	b := events.Base{Task: events.Task{ID: "gone-1", Type: "new_fix", Subject: "a.go"}, Run: events.Run{Pass: 1, Attempt: 1}}
	st := task.New(b.Task)
	st = task.Act(st, events.Action{TaskID: "gone-1", Action: events.ActionCancel, By: "alice", At: now})
	if _, _, err := e.tasks.Create(ctx, st); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(events.Verified{Base: b})
	outs, err := e.gate.Handle(ctx, &services.Msg{Subject: events.TaskSubject("gone-1", events.StageVerified), Data: data, Delivered: 1, Time: now})
	if err != nil || len(outs) != 0 {
		t.Fatalf("gate on a cancelled task: %d outputs, %v", len(outs), err)
	}
	stats, err := e.trust.Get(ctx, "new_fix")
	if err != nil {
		t.Fatal(err)
	}
	if len(stats.Canaries) != 0 || len(stats.Gates) != 0 {
		t.Fatalf("the cancelled task touched trust: %+v", stats)
	}
	// Without the cancel the same pass is admitted as a canary.
	if to, _, err := e.pass("live-1", "new_fix", events.Run{Pass: 1, Attempt: 1}, 0); err != nil || to != events.StageAdmitted {
		t.Fatalf("a live task went to %s (%v)", to, err)
	}
}

// A canary cancelled while it runs never records an outcome: the next pass
// refused a place finds it ended and takes its place, instead of waiting
// for the place to expire.
func TestCanaryOfAnEndedTaskIsReleased(t *testing.T) {
	e := newEnv(t, &policy.File{Defaults: policy.Type{Canary: ptr(3)}})
	ctx := context.Background()
	for i := range 3 {
		if to, _, err := e.pass(fmt.Sprintf("c%d", i), "new_type", first(), 0); err != nil || to != events.StageAdmitted {
			t.Fatalf("canary %d: %s %v", i, to, err)
		}
	}
	if to, _, err := e.pass("w1", "new_type", first(), 0); err != nil || to != events.StageHeld {
		t.Fatalf("a pass went beyond the canaries: %s %v", to, err)
	}
	if _, err := e.tasks.Update(ctx, "c1", func(st *events.TaskState, _ bool) error {
		*st = task.Act(*st, events.Action{TaskID: "c1", Action: events.ActionCancel, By: "alice", At: now})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Once the view shows every place taken (a cancel records no
	// outcome), the pass goes to the held consumer without a look, and
	// that consumer's full look finds c1 ended and takes its place; a view
	// that has not yet seen the places taken makes the full look at once.
	switch stage, _, err := e.pass("w2", "new_type", first(), 0); {
	case err != nil:
		t.Fatal(err)
	case stage == events.StageHeld:
		if outs, err := e.held("w2", "new_type", first(), events.HoldCanary, 0, gate.FullLookEvery); err != nil || to(outs) != events.StageAdmitted {
			t.Fatalf("a full look after a canary was cancelled: %s %v", to(outs), err)
		}
	case stage != events.StageAdmitted:
		t.Fatalf("after a canary was cancelled: %s", stage)
	}
	stats, err := e.trust.Get(ctx, "new_type")
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, c := range stats.Canaries {
		held = append(held, c.Key)
	}
	slices.Sort(held)
	if !slices.Equal(held, []string{"c0", "c2", "w2"}) {
		t.Fatalf("canary places held by %v, want c0 c2 w2", held)
	}
}

// A retry of a task a human cancelled, stopped by the gate (its type's
// trust collapsed), files no review record: the task has ended.
func TestCancelledRetryFilesNoReview(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.outcomes("css_fix", 10, 0, "")
	b := events.Base{Task: events.Task{ID: "gone-2", Type: "css_fix", Subject: "a.go"}, Run: retry(events.RungRefine)}
	st := task.New(b.Task)
	st.Pass = b.Run.Pass
	st = task.Act(st, events.Action{TaskID: "gone-2", Action: events.ActionCancel, By: "alice", At: now})
	if _, _, err := e.tasks.Create(ctx, st); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(events.Verified{Base: b})
	outs, err := e.gate.Handle(ctx, &services.Msg{Subject: events.TaskSubject("gone-2", events.StageVerified), Data: data, Delivered: 1, Time: now})
	if err != nil || len(outs) != 0 {
		t.Fatalf("gate on a cancelled task's retry: %d outputs, %v", len(outs), err)
	}
}

func ptr[T any](v T) *T { return &v }

// held runs one look at a held pass through the gate's held consumer: the
// pass was held for hold, since heldFor before now; delivered counts the
// looks.
func (e *env) held(id, typ string, run events.Run, hold events.Hold, heldFor time.Duration, delivered int) ([]services.Out, error) {
	e.t.Helper()
	b := events.Base{Task: events.Task{ID: id, Type: typ, Subject: id + ".go"}, Run: run, At: now.Add(-heldFor)}
	data, _ := json.Marshal(events.Held{Base: b, Hold: hold})
	return e.gate.HandleHeld(context.Background(), &services.Msg{
		Subject: events.TaskSubject(id, events.StageHeld), Data: data, Delivered: delivered, Time: now.Add(-heldFor), Seq: 1,
	})
}

// asleep reports whether a look at a pass held for trust left it asleep:
// no output, no error (its message is acked), and the pass's entry in the
// held index.
func (e *env) asleep(id string, pass int, outs []services.Out, err error) bool {
	e.t.Helper()
	if err != nil || len(outs) != 0 {
		return false
	}
	for _, key := range e.asleepKeys() {
		if _, _, kid, kpass, ok := services.ParseHeldKey(key); ok && kid == id && kpass == pass {
			return true
		}
	}
	return false
}

// asleepKeys lists the held index.
func (e *env) asleepKeys() []string {
	e.t.Helper()
	keys, err := e.index.KV().ListKeys(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	var all []string
	for k := range keys.Keys() {
		all = append(all, k)
	}
	return all
}

// to is where outs went: the stage or review reason of its record.
func to(outs []services.Out) string {
	outs = records(outs)
	if len(outs) == 0 {
		return ""
	}
	if reason, _, ok := events.ParseReviewSubject(outs[0].Subject); ok {
		return reason
	}
	_, stage, _ := events.ParseTaskSubject(outs[0].Subject)
	return stage
}
