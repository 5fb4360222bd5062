package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/metricstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// dispatch policy shadow, promote and shadow -clear against a running
// mesh: under a shadow policy whose ladder ends after one attempt, a task
// that fails once then succeeds still succeeds (the shadow is never
// enforced), while its gate decisions record what the shadow would have
// done and every decision is counted once under both; promote makes the
// shadow the policy in force, as a new revision, and drops it.
func TestPolicyShadowAndPromote(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := reviewtest.Start(t, func(n int, _ openaitest.Request) openaitest.Reply {
		if n == 1 {
			return openaitest.Reply{Content: openaitest.Failure("first idea", "still broken")}
		}
		return openaitest.Reply{Content: openaitest.Success("fixed")}
	}, reviewtest.Options{Policy: &policy.File{Types: map[string]policy.Type{"css_fix": {Model: "first"}}}, Registry: reg})
	c := newCLI(t, m)
	ctx := context.Background()
	kv, err := m.Srv.JS.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	live, err := policykv.Current(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}

	path := writeFile(t, t.TempDir(), "shadow.json", `{"types": {"css_fix": {"model": "first", "max_retries": 1}}}`)
	if out := c.ok("policy", "shadow", path); !strings.Contains(out, "shadow policy revision") {
		t.Fatalf("policy shadow said %q", out)
	}
	_, rev, err := policykv.Shadow(ctx, kv)
	if err != nil || rev == 0 {
		t.Fatalf("shadow in the bucket: rev %d, %v", rev, err)
	}
	if err := m.Shadow.Seen(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if cur, _ := policykv.Current(ctx, kv); cur != live {
		t.Fatalf("a shadow changed the policy in force: revision %d, was %d", cur, live)
	}

	id := m.Submit(events.Submit{ID: "sh-1", Type: "css_fix", Subject: "src/app.css", Payload: json.RawMessage(`{}`)})
	all := m.WaitStage(id, events.StageSucceeded, 1)
	if n := timeline.Count(all, events.StageExecuted); n != 2 {
		t.Fatalf("the live ladder ran %d attempts, want 2 (the shadow's ends after 1 but is never enforced): %v", n, timeline.Stages(all))
	}
	admitted := 0
	for _, e := range all {
		if e.Stage != events.StageAdmitted {
			continue
		}
		admitted++
		var ev events.Admitted
		if err := json.Unmarshal(e.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if s := ev.Trust.Shadow; s == nil || s.Act != "admit" || s.PolicyRev != rev {
			t.Fatalf("admitted pass %d records shadow %+v, want admit under revision %d", ev.Run.Pass, s, rev)
		}
	}
	// The recorder's decisions under the shadow are recorded on what it
	// published: the retry after attempt 1 (straight to the gate: css_fix
	// has no verifier) would have been a hand-off; the success a success.
	recorded := map[string]string{}
	for _, e := range all {
		var ev struct {
			Shadow *events.ShadowDecision `json:"shadow"`
		}
		if (e.Stage == events.StageVerified || e.Stage == events.StageSucceeded) && json.Unmarshal(e.Data, &ev) == nil && ev.Shadow != nil {
			recorded[e.Stage] = ev.Shadow.Act
		}
	}
	if recorded[events.StageVerified] != "handoff" || recorded[events.StageSucceeded] != "succeeded" {
		t.Fatalf("the recorder's shadow decisions on its events: %v", recorded)
	}
	got := metricstest.Family(t, reg, "dispatch_shadow_decisions_total")
	want := map[string]float64{
		"live=admit,shadow=admit,type=css_fix":         float64(admitted), // the gate, each pass once
		"live=retry,shadow=handoff,type=css_fix":       1,                 // the recorder after attempt 1
		"live=succeeded,shadow=succeeded,type=css_fix": 1,
	}
	if len(got) != len(want) {
		t.Fatalf("dispatch_shadow_decisions_total = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("dispatch_shadow_decisions_total = %v, want %v", got, want)
		}
	}

	out := c.ok("policy", "promote")
	if !strings.Contains(out, "in force (the shadow policy, promoted)") {
		t.Fatalf("promote said %q", out)
	}
	cur, err := policykv.Current(ctx, kv)
	if err != nil || cur <= rev {
		t.Fatalf("revision in force %d after promoting shadow revision %d: %v", cur, rev, err)
	}
	f, err := policykv.At(ctx, kv, cur)
	if err != nil || f.For("css_fix").MaxRetries != 1 {
		t.Fatalf("policy in force after promote: %+v, %v", f, err)
	}
	if f, _, err := policykv.Shadow(ctx, kv); f != nil || err != nil {
		t.Fatalf("the shadow stays after promote: %v %v", f, err)
	}
	if _, err := c.run("policy", "promote"); err == nil || !strings.Contains(err.Error(), "no shadow policy") {
		t.Fatalf("promote without a shadow: %v", err)
	}
	c.ok("policy", "shadow", path)
	if out := c.ok("policy", "shadow", "-clear"); !strings.Contains(out, "dropped") {
		t.Fatalf("shadow -clear said %q", out)
	}
	if f, _, err := policykv.Shadow(ctx, kv); f != nil || err != nil {
		t.Fatalf("the shadow stays after -clear: %v %v", f, err)
	}
}
