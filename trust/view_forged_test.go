package trust_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// syncBuffer collects what a View logs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A user who may create consumers reads the View's two inboxes (the
// outcome stream's, the gate facts') on the monitoring port and has
// consumers deliver into them: from a stream of its own holding failed
// outcomes and a block streak of 99 under the very subjects of the
// outcome stream and the bucket, and replays of the outcome stream and of
// the bucket's stream. The View takes none of it, logs each, and takes the
// next real outcome and fact. (nats.go's ordered consumer passed forged
// outcomes on and then lost every real one after them.)
func TestViewIgnoresForgedDeliveries(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	newOutcomeStream(t, srv.JS)
	kv := newKV(t, srv.JS)
	store := trust.NewStore(kv, trust.Policy{})
	all := seq("SSF")
	publish(t, srv.JS, "css_fix", all[0])
	publish(t, srv.JS, "css_fix", all[1])
	if _, _, err := store.Gate(ctx, "css_fix", "a:1:gate", true); err != nil {
		t.Fatal(err)
	}
	nc, js := srv.Connect(t)
	var logs syncBuffer
	v, err := trust.NewView(ctx, js, kv, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Stop)
	if st := v.Stats("css_fix"); len(st.Outcomes) != 2 || st.BlockStreak != 1 {
		t.Fatalf("at start: %d outcomes, streak %d", len(st.Outcomes), st.BlockStreak)
	}

	var forged []*nats.Msg
	for i := range 5 {
		o, err := trust.OutcomeMsg("css_fix", trust.Outcome{Key: fmt.Sprintf("forged%d:1", i), At: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		facts, err := json.Marshal(trust.Stats{Type: "css_fix", BlockStreak: 99})
		if err != nil {
			t.Fatal(err)
		}
		f := nats.NewMsg("$KV.test_trust.css_fix")
		f.Data = facts
		forged = append(forged, o, f)
	}
	stream := natstest.ForgedStream(t, srv.JS, forged...)
	inboxes := srv.Inboxes(t, nc)
	if len(inboxes) != 2 {
		t.Fatalf("inboxes %v, want the outcome stream's and the bucket's", inboxes)
	}
	for _, inbox := range inboxes {
		natstest.Deliver(t, srv.JS, stream, 0, inbox)
		natstest.Deliver(t, srv.JS, trust.OutcomeStream, 1, inbox)
		natstest.Deliver(t, srv.JS, "KV_test_trust", 1, inbox)
	}
	const dropped = 2 * (10 + 2 + 1) // per inbox: the forged messages, two outcomes, one fact
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(logs.String(), follow.ForgedDelivery) < dropped {
		if time.Now().After(deadline) {
			t.Fatalf("the forged deliveries never reached the View:\n%s", logs.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
	if st := v.Stats("css_fix"); !slices.Equal(keysOf(st.Outcomes), keysOf(all[:2])) || st.BlockStreak != 1 {
		t.Fatalf("after forged deliveries: outcomes %v, streak %d", keysOf(st.Outcomes), st.BlockStreak)
	}

	publish(t, srv.JS, "css_fix", all[2])
	if _, _, err := store.Gate(ctx, "css_fix", "b:1:gate", true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the next real outcome and fact", func() bool {
		st := v.Stats("css_fix")
		return len(st.Outcomes) == 3 && st.BlockStreak == 2
	})
	if st := v.Stats("css_fix"); !slices.Equal(keysOf(st.Outcomes), keysOf(all)) {
		t.Errorf("outcomes %v, want %v", keysOf(st.Outcomes), keysOf(all))
	}
	if err := v.Sync(ctx, "css_fix"); err != nil {
		t.Errorf("sync after forged deliveries: %v", err)
	}
}
