package rebuild

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Apply keeps what only the executor knows of a task (its transient count,
// unbilled spend, banned tool calls, tool loop, submission sequence): the
// events cannot rebuild it, so a state that differs in nothing else is not
// written, and one that differs is written with the live state's.
func TestApplyKeepsWhatOnlyTheExecutorKnows(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	kv, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.BucketTasks})
	if err != nil {
		t.Fatal(err)
	}
	live := events.TaskState{ID: "t1", Type: "css_fix", Subject: "a.css", Status: events.StatusRunning, Attempts: 1, Pass: 1,
		SubmitSeq: 7, TransientRetries: 3, Unbilled: events.Usage{TokensIn: 5000, TokensOut: 900, Cost: 0.42},
		FailedRequests: []string{"h1@1", "tool:abc@1"}, Resume: &events.Resume{Pass: 1}}
	data, _ := json.Marshal(live)
	rev, err := kv.Put(ctx, "t1", data)
	if err != nil {
		t.Fatal(err)
	}
	same := normTask(live) // what a replay yields
	if err := Apply(ctx, Live{Tasks: kv}, &Stores{Tasks: map[string]*events.TaskState{"t1": &same}}); err != nil {
		t.Fatal(err)
	}
	if e, _ := kv.Get(ctx, "t1"); e.Revision() != rev {
		t.Fatalf("a state that differs in nothing the events decide was written again (revision %d → %d)", rev, e.Revision())
	}
	differs := normTask(live)
	differs.Attempts = 2
	if err := Apply(ctx, Live{Tasks: kv}, &Stores{Tasks: map[string]*events.TaskState{"t1": &differs}}); err != nil {
		t.Fatal(err)
	}
	e, _ := kv.Get(ctx, "t1")
	var after events.TaskState
	if err := json.Unmarshal(e.Value(), &after); err != nil {
		t.Fatal(err)
	}
	if after.Attempts != 2 || after.SubmitSeq != 7 || after.TransientRetries != 3 || after.Unbilled != live.Unbilled ||
		after.Resume == nil || !slices.Equal(after.FailedRequests, []string{"h1@1", "tool:abc@1"}) {
		t.Fatalf("after Apply %+v: want the rebuilt attempts with the executor's own facts kept", after)
	}
}

// Past the horizon the live stores know what the replay cannot: a task
// created before it, older history entries and outcomes, a block streak and
// gate marks that began before it. They are taken as held, twice over the
// same Stores (Compare, then Apply) as once.
func TestKeepBeforeHorizon(t *testing.T) {
	h := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	before, after := h.Add(-time.Hour), h.Add(time.Hour)
	cur := &current{
		tasks: map[string]*events.TaskState{"old": {ID: "old", Attempts: 3, CreatedAt: before}, "new": {ID: "new", Attempts: 1, CreatedAt: after}},
		facts: map[string]*trust.Stats{"css_fix": {Type: "css_fix", BlockStreak: 3, Gates: []trust.GateMark{{Key: "a"}, {Key: "b"}, {Key: "c"}}}},
		outcomes: map[string]*trust.Stats{"css_fix": {Type: "css_fix", Outcomes: []trust.Outcome{
			{Key: "o1", At: before}, {Key: "o2", At: after}}}},
		spend: map[[2]string]trust.DaySpend{{"css_fix", trust.Day(h)}: {Type: "css_fix", Day: trust.Day(h), Tokens: 500}},
	}
	s := &Stores{Horizon: h,
		Tasks: map[string]*events.TaskState{"old": {ID: "old", Attempts: 1, CreatedAt: before}, "new": {ID: "new", Attempts: 2, CreatedAt: after}},
		Trust: map[string]*trust.Stats{"css_fix": {Type: "css_fix", BlockStreak: 1, Gates: []trust.GateMark{{Key: "c"}},
			Outcomes: []trust.Outcome{{Key: "o2", At: after}}}},
		History: map[string]*history.Record{},
		Spend:   map[[2]string]trust.DaySpend{{"css_fix", trust.Day(h)}: {Type: "css_fix", Day: trust.Day(h), Tokens: 200}},
	}
	for range 2 {
		s.keepBeforeHorizon(cur)
	}
	if s.Tasks["old"].Attempts != 3 || s.Tasks["new"].Attempts != 2 {
		t.Errorf("tasks: old %d attempts (want the live 3), new %d (want the replay's 2)", s.Tasks["old"].Attempts, s.Tasks["new"].Attempts)
	}
	tr := s.Trust["css_fix"]
	if tr.BlockStreak != 3 || len(tr.Gates) != 3 || len(tr.Outcomes) != 2 || tr.Outcomes[0].Key != "o1" {
		t.Errorf("trust %+v: want the live streak and marks, the older outcome merged once", tr)
	}
	if sp := s.Spend[[2]string{"css_fix", trust.Day(h)}]; sp.Tokens != 500 {
		t.Errorf("the horizon's day of spend %+v, want the live counters", sp)
	}
}
