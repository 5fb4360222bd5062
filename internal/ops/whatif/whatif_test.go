package whatif_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/internal/bench/spendbench"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	core "github.com/dispatchmesh/dispatchmesh/internal/core/whatif"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/whatif"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/metricstest"
)

// Policy A is the defaults; B raises the threshold and shortens the
// ladder.
const (
	policyA = `{"defaults": {}}`
	// policyA2 changes only a field no decision reads (how many previous
	// attempts the prompt shows).
	policyA2 = `{"defaults": {"previous_attempts": 3}}`
	policyB  = `{"defaults": {"threshold": 0.45, "max_retries": 3}}`
)

// workload: five types — healthy, hopeless, two of mixed difficulty
// (coinflip, history) and a regression (healthy, then hopeless) — in
// order, the regression's phases one after the other.
func workload() []spendbench.Task {
	var tasks []spendbench.Task
	add := func(typ, scenario string, n int) {
		for range n {
			id := fmt.Sprintf("wi-%03d", len(tasks)+1)
			payload, _ := json.Marshal(map[string]string{"scenario": scenario, "ticket": id, "issue": "fix it (scenario=" + scenario + " ticket=" + id + ")"})
			tasks = append(tasks, spendbench.Task{ID: id, Type: typ, Scenario: scenario, Subject: "src/" + id + ".go", Payload: payload})
		}
	}
	for range 2 {
		add("healthy", spendbench.Healthy, 6)
		add("hopeless", spendbench.Hopeless, 7)
		add("coinflip", spendbench.Coinflip, 6)
		add("history", spendbench.History, 5)
	}
	add("regress", spendbench.Healthy, 10)
	add("regress", spendbench.Hopeless, 12)
	return tasks
}

// run runs the workload through a mesh under pol (with a shadow policy
// when shadow is set, its metrics on reg) and returns what it recorded
// and the figures measured from outside.
func run(t *testing.T, pol, shadow string, reg prometheus.Registerer) ([]rebuild.Message, spendbench.Figures) {
	t.Helper()
	var msgs []rebuild.Message
	cfg := spendbench.Config{Policy: pol, Shadow: shadow, Registry: reg, Latency: -1, Mode: spendbench.ModeSteady, Rate: 5, Wait: 5 * time.Minute,
		Inspect: func(ctx context.Context, js jetstream.JetStream) error {
			var err error
			msgs, _, err = rebuild.Read(ctx, js)
			return err
		}}
	f, err := spendbench.RunMesh(context.Background(), cfg, workload())
	if err != nil {
		t.Fatal(err)
	}
	return msgs, f
}

func replay(t *testing.T, msgs []rebuild.Message, pol string) core.Report {
	t.Helper()
	f, err := policy.Parse([]byte(pol))
	if err != nil {
		t.Fatal(err)
	}
	evs, skipped := whatif.Events(msgs)
	if len(skipped) > 0 {
		t.Fatalf("skipped: %v", skipped)
	}
	return core.Replay(evs, core.Options{Policy: f})
}

// A workload of five types under policy A; the what-if of B on A's
// history; then the same workload under B live. Under A itself the
// what-if must reproduce A's figures exactly; B's what-if must come
// within 10% of B live in tokens and tasks sent to a human.
func TestWhatIfReplaysAndPredicts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a mesh twice")
	}
	histA, _ := run(t, policyA, "", nil)
	same := replay(t, histA, policyA)
	t.Logf("A under A: actual %+v whatif %+v", same.Actual, same.WhatIf)
	for _, c := range same.Changed {
		for _, m := range histA {
			if ev, ok, _ := whatif.Decode(m); ok && ev.Base.Task.ID == c.ID {
				t.Logf("%s seq %d stored %s at %s pass %d: %+v", ev.Kind, m.Seq, m.Stored.Format("15:04:05.000"), ev.Base.At.Format("15:04:05.000"), ev.Base.Run.Pass, ev.Trust)
			}
		}
	}
	if same.Actual != same.WhatIf.Figures || same.WhatIf.Estimated != (core.Estimated{}) || len(same.Changed) != 0 {
		t.Fatalf("the live policy does not reproduce the history:\nactual %+v\nwhatif %+v\nchanged %+v", same.Actual, same.WhatIf, same.Changed)
	}
	if unread := replay(t, histA, policyA2); !sameReport(unread, same) {
		t.Fatalf("a field no decision reads changed the answer: %+v", unread)
	}
	b := replay(t, histA, policyB)
	t.Logf("A under B: actual %+v whatif %+v", b.Actual, b.WhatIf)
	for _, c := range b.Changed {
		t.Logf("changed %s %s: actual %s/%s/%s %d attempts; whatif %s/%s/%s %d attempts; %s", c.ID, c.Type,
			c.Actual.Fate, c.Actual.Decision, c.Actual.Cause, c.Actual.Attempts, c.WhatIf.Fate, c.WhatIf.Decision, c.WhatIf.Cause, c.WhatIf.Attempts, c.Cause)
	}
	histB, _ := run(t, policyB, "", nil)
	live := replay(t, histB, policyB)
	t.Logf("B live: actual %+v", live.Actual)
	predTokens := float64(b.WhatIf.Tokens) + b.WhatIf.Estimated.Tokens
	predHuman := float64(b.WhatIf.ToHuman) + b.WhatIf.Estimated.ToHuman
	dt := math.Abs(predTokens-float64(live.Actual.Tokens)) / float64(live.Actual.Tokens)
	dh := math.Abs(predHuman-float64(live.Actual.ToHuman)) / math.Max(float64(live.Actual.ToHuman), 1)
	t.Logf("what-if B on A's history: tokens %.0f, to_human %.1f; B live: tokens %d, to_human %d; off by %.1f%% and %.1f%%",
		predTokens, predHuman, live.Actual.Tokens, live.Actual.ToHuman, 100*dt, 100*dh)
	if dt > 0.10 || dh > 0.10 {
		t.Errorf("what-if of B is more than 10%% off B live: tokens %.1f%%, to_human %.1f%%", 100*dt, 100*dh)
	}
}

func sameReport(a, b core.Report) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// A shadow policy changes nothing the mesh does: the same workload under
// B, with A as the shadow, spends and ends as it does without one; and
// each decision is counted once under both: as many as the gate's
// decision records and the recorder's recorded attempts on the stream.
func TestShadowChangesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a mesh twice")
	}
	_, plain := run(t, policyB, "", nil)
	reg := prometheus.NewRegistry()
	hist, shadowed := run(t, policyB, policyA, reg)
	spent := func(f spendbench.Figures) string { // what was spent and how it ended, not how long it took
		return fmt.Sprint(f.Tokens, f.TokensIn, f.TokensOut, f.WastedTokens, f.Resolved, f.Calls, f.Attempts, f.Retries, f.RetrySuccesses, f.Statuses, f.Held)
	}
	if spent(plain) != spent(shadowed) {
		t.Fatalf("the shadow changed the run:\nwithout %+v %v held %d\nwith    %+v %v held %d",
			plain.Tally, plain.Statuses, plain.Held, shadowed.Tally, shadowed.Statuses, shadowed.Held)
	}
	evs, _ := whatif.Events(hist)
	decisions, attempts := map[string]bool{}, map[string]bool{}
	for _, ev := range evs {
		key := fmt.Sprintf("%s/%d/%s", ev.Base.Task.ID, ev.Base.Run.Pass, ev.Kind)
		switch ev.Kind {
		case core.KindAdmitted, core.KindHeld, core.KindGated, core.KindHandoff:
			decisions[key] = true
		case core.KindExecuted:
			attempts[key] = true
		}
	}
	counted := 0.0
	for _, v := range metricstest.Family(t, reg, "dispatch_shadow_decisions_total") {
		counted += v
	}
	t.Logf("figures with and without the shadow: %+v; %v decisions counted under both, %d gate decisions and %d attempts recorded",
		shadowed.Tally, counted, len(decisions), len(attempts))
	if int(counted) != len(decisions)+len(attempts) {
		t.Fatalf("%v shadow decisions counted, want %d gate decisions + %d recorded attempts: %v",
			counted, len(decisions), len(attempts), metricstest.Family(t, reg, "dispatch_shadow_decisions_total"))
	}
}
