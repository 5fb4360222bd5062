package rebuild

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/internal/natstest"
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
