package policykv_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// A user who may create consumers reads the watcher's inbox on the
// monitoring port and has two consumers deliver into it: one of a stream of
// its own holding a policy under the key's very subject (at revisions from
// 100000 on), one of the policy bucket's stream replaying an old revision. The policy in force does not change, both are logged, and
// the next real put still applies. (With nats.go's KV watcher the first
// put "revision 100000" in force, and later puts were lost.)
func TestWatchIgnoresForgedDeliveries(t *testing.T) {
	srv, kv := policyBucket(t)
	ctx := t.Context()
	file := func(model string) *policy.File {
		return &policy.File{Types: map[string]policy.Type{"a": {Model: model}}}
	}
	old, err := policykv.Put(ctx, kv, file("old"))
	if err != nil {
		t.Fatal(err)
	}
	current, err := policykv.Put(ctx, kv, file("current"))
	if err != nil {
		t.Fatal(err)
	}
	nc, js := srv.Connect(t)
	bucket, err := js.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	src, err := policykv.Watch(ctx, js, bucket, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if src.Rev() != current {
		t.Fatalf("started on revision %d, want %d", src.Rev(), current)
	}

	body, err := policy.Encode(file("forged"))
	if err != nil {
		t.Fatal(err)
	}
	var forged []*nats.Msg
	for range 5 { // delivery sequences 1..5: one is the watcher's next
		m := nats.NewMsg("$KV." + services.BucketPolicy + "." + policy.Key)
		m.Header.Set("KV-Operation", "PUT")
		m.Data = body
		forged = append(forged, m)
	}
	stream := natstest.ForgedStream(t, srv.JS, forged...)
	inboxes := srv.Inboxes(t, nc)
	if len(inboxes) == 0 {
		t.Fatal("the watcher's inbox is not listed")
	}
	for _, inbox := range inboxes {
		natstest.Deliver(t, srv.JS, stream, 0, inbox)
		natstest.Deliver(t, srv.JS, "KV_"+services.BucketPolicy, old, inbox)
	}
	deadline := time.Now().Add(patience)
	for strings.Count(logs.String(), follow.ForgedDelivery) < 7 { // 5 + revisions old and current
		if time.Now().After(deadline) {
			t.Fatalf("the forged deliveries never reached the watcher:\n%s", logs.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
	if src.Rev() != current || src.For("a").Model != "current" {
		t.Fatalf("after forged deliveries: revision %d, model %q; want %d, current", src.Rev(), src.For("a").Model, current)
	}

	next, err := policykv.Put(ctx, kv, file("next"))
	if err != nil {
		t.Fatal(err)
	}
	seen(t, src, next)
	if src.Rev() != next || src.For("a").Model != "next" {
		t.Fatalf("the put after forged deliveries: revision %d, model %q; want %d, next", src.Rev(), src.For("a").Model, next)
	}
	if strings.Contains(logs.String(), "rev=100") {
		t.Errorf("a forged revision was taken:\n%s", logs.String())
	}
}
