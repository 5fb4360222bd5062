package follow_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// patience bounds every wait: a deadlock guard, not a timing assertion.
const patience = 30 * time.Second

// eventually waits until cond holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// seen collects what a follower passes on.
type seen struct {
	mu   sync.Mutex
	msgs []string
}

func (s *seen) add(m follow.Msg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, fmt.Sprintf("%s=%s@%d", m.Subject, m.Data, m.Seq))
}

func (s *seen) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// forgeAll has every inbox of nc fed, by a push consumer each, with the
// messages of stream from sequence from (0: all).
func forgeAll(t *testing.T, srv *natstest.Server, nc *nats.Conn, stream string, from uint64) {
	t.Helper()
	inboxes := srv.Inboxes(t, nc)
	if len(inboxes) == 0 {
		t.Fatal("no inbox to feed")
	}
	for _, inbox := range inboxes {
		natstest.Deliver(t, srv.JS, stream, from, inbox)
	}
}

// A delivery into the follower's inbox from a consumer of another stream,
// or from another consumer of the followed stream (a replay), is dropped
// and counted; it moves nothing: the next real message is passed on.
// (nats.go's ordered consumer passes such deliveries on when their delivery
// sequence is the one it expects, and re-creates its consumer after their
// stream sequence: every later real message is lost.)
func TestStreamTakesOnlyItsOwnConsumer(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.*"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.JS.Publish(ctx, "out.a", []byte("real1")); err != nil {
		t.Fatal(err)
	}
	nc, js := srv.Connect(t)
	var got seen
	logs := &logBuffer{}
	f, err := follow.Stream(ctx, js, follow.Config{Stream: "OUT", Filters: []string{"out.*"}, Log: logs.logger()}, got.add)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	eventually(t, "the stored message", func() bool { return len(got.all()) == 1 })

	var forged []*nats.Msg
	for range 5 { // delivery sequences 1..5: one is the follower's next
		forged = append(forged, &nats.Msg{Subject: "out.a", Data: []byte("forged")}) // the followed subject, in another stream
	}
	forgeAll(t, srv, nc, natstest.ForgedStream(t, srv.JS, forged...), 0)
	forgeAll(t, srv, nc, "OUT", 1) // a replay of real1
	eventually(t, "six forged deliveries dropped", func() bool { return f.Forged() >= 6 })
	if !logs.has("level=WARN msg=\""+follow.ForgedDelivery) || !logs.has("claimed_stream=FORGED_") || !logs.has("subject=out.a") {
		t.Errorf("forged deliveries not logged with what they claim:\n%s", logs)
	}

	if _, err := srv.JS.Publish(ctx, "out.b", []byte("real2")); err != nil {
		t.Fatal(err)
	}
	want := []string{"out.a=real1@1", "out.b=real2@2"}
	eventually(t, "the next real message", func() bool { return len(got.all()) == 2 })
	if g := got.all(); !slices.Equal(g, want) {
		t.Errorf("passed on %v, want %v", g, want)
	}
}

// A follower whose consumer is gone (deleted, a server restart) creates
// another after the last message it passed on: nothing is lost or repeated.
func TestStreamReplacesALostConsumer(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.*"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.JS.Publish(ctx, "out.a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	_, js := srv.Connect(t)
	var got seen
	f, err := follow.Stream(ctx, js, follow.Config{Stream: "OUT", Heartbeat: 100 * time.Millisecond, Log: discard}, got.add)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	eventually(t, "the stored message", func() bool { return len(got.all()) == 1 })
	stream, err := srv.JS.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	names := stream.ConsumerNames(ctx)
	for name := range names.Name() {
		if err := srv.JS.DeleteConsumer(ctx, "OUT", name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := srv.JS.Publish(ctx, "out.b", []byte("2")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the message stored while no consumer existed", func() bool { return len(got.all()) == 2 })
	if g, want := got.all(), []string{"out.a=1@1", "out.b=2@2"}; !slices.Equal(g, want) {
		t.Errorf("passed on %v, want %v", g, want)
	}
}

// CaughtUp is called once, right after what the stream held at the start
// has been passed on; at once for an empty stream.
func TestStreamCaughtUp(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.*"}}); err != nil {
		t.Fatal(err)
	}
	held := 0 // messages in the stream
	for _, stored := range []int{0, 3} {
		held += stored
		for i := range stored {
			if _, err := srv.JS.Publish(ctx, "out.a", fmt.Appendf(nil, "%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		var got seen
		caught := make(chan int, 2)
		f, err := follow.Stream(ctx, srv.JS, follow.Config{Stream: "OUT", Log: discard, CaughtUp: func() { caught <- len(got.all()) }}, got.add)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case n := <-caught:
			if n != held {
				t.Errorf("caught up after %d messages, want %d", n, held)
			}
		case <-time.After(patience):
			t.Fatal("never caught up")
		}
		if _, err := srv.JS.Publish(ctx, "out.a", []byte("later")); err != nil {
			t.Fatal(err)
		}
		held++
		eventually(t, "a later message", func() bool { return len(got.all()) == held })
		f.Stop()
		<-f.Done()
		if len(caught) != 0 {
			t.Error("caught up twice")
		}
	}
}

func TestSubjectMatches(t *testing.T) {
	for _, c := range []struct {
		subject, filter string
		want            bool
	}{
		{"a.b.c", "a.b.c", true},
		{"a.b.c", "a.*.c", true},
		{"a.b.c", "a.>", true},
		{"a", "a.>", false},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b", false},
		{"$KV.b.k", "$KV.b.>", true},
		{"$KX.b.k", "$KV.b.>", false},
		{"a.b.c", ">", true},
		{"a.b.c", "*.*", false},
	} {
		if got := follow.SubjectMatches(c.subject, c.filter); got != c.want {
			t.Errorf("SubjectMatches(%q, %q) = %v", c.subject, c.filter, got)
		}
	}
}

// Someone who learns the follower's consumer name (listing consumers) and
// re-creates that consumer on the same inbox from the stream's start
// replays old messages under the right name with the right delivery
// sequence: a follower never goes back to a stream position it passed.
// Nor do another consumer's heartbeats keep it from replacing a consumer
// that was deleted.
func TestStreamNeverGoesBack(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := srv.JS.Publish(ctx, "s.x", fmt.Appendf(nil, "v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	_, js := srv.Connect(t)
	var got seen
	f, err := follow.Stream(ctx, js, follow.Config{Stream: "S", Heartbeat: 100 * time.Millisecond}, got.add)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()

	eventually(t, "the three messages", func() bool { return len(got.all()) == 3 })

	// The follower's consumer, as a consumer listing shows it; deleted,
	// and re-created by its replacement's name from the start.
	current := func() *jetstream.ConsumerInfo {
		var info *jetstream.ConsumerInfo
		eventually(t, "the follower's consumer", func() bool {
			s, err := srv.JS.Stream(ctx, "S")
			if err != nil {
				return false
			}
			for ci := range s.ListConsumers(ctx).Info() {
				info = ci
			}
			return info != nil
		})
		return info
	}
	first := current()
	if err := srv.JS.DeleteConsumer(ctx, "S", first.Name); err != nil {
		t.Fatal(err)
	}
	var second *jetstream.ConsumerInfo
	eventually(t, "a replacement consumer", func() bool {
		second = current()
		return second.Name != first.Name
	})
	if err := srv.JS.DeleteConsumer(ctx, "S", second.Name); err != nil {
		t.Fatal(err)
	}
	forged := f.Forged()
	if _, err := srv.JS.CreatePushConsumer(ctx, "S", jetstream.ConsumerConfig{
		Name: second.Name, DeliverSubject: second.Config.DeliverSubject, AckPolicy: jetstream.AckNonePolicy,
		IdleHeartbeat: 100 * time.Millisecond,
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replayed messages to be refused", func() bool { return f.Forged() >= forged+3 })
	if _, err := srv.JS.Publish(ctx, "s.x", []byte("v4")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the next real message", func() bool { return len(got.all()) == 4 })
	if all := got.all(); !slices.Equal(all, []string{"s.x=v1@1", "s.x=v2@2", "s.x=v3@3", "s.x=v4@4"}) {
		t.Fatalf("passed on %v, want each message once, in order", all)
	}
}
