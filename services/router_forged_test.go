package services_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// A publish the stream answers as a duplicate of a message stored on
// another subject (a squatted Msg-Id) is not taken for "already stored":
// the output was not stored, so the input is not acked, and its retries
// end with a human, never in silence.
func TestRouterDuplicateOfAnotherMessageIsAnError(t *testing.T) {
	s := setup(t)
	squat := nats.NewMsg(events.TaskSubject("t1", "elsewhere"))
	squat.Data = []byte("junk")
	if _, err := s.JS.PublishMsg(context.Background(), squat, jetstream.WithMsgID("t1:1:out")); err != nil {
		t.Fatal(err)
	}
	review := subscribe(t, s.NC, events.ReviewFilter)
	var calls atomic.Int32
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		calls.Add(1)
		o, err := services.Emit(events.TaskSubject("t1", "out"), "t1:1:out", "test.v1", "t1", "x")
		return []services.Out{o}, err
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
	m := review()
	if m.Subject != events.ReviewSubject(events.ReviewPoison, "t1") {
		t.Fatalf("review record on %s, want the poison record of t1", m.Subject)
	}
	if e := m.Header.Get(events.HeaderError); !strings.Contains(e, services.ErrDuplicateMismatch.Error()) {
		t.Fatalf("poison record says %q, want it to name the squatted Msg-Id", e)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("handled %d times, want MaxDeliver (3)", n)
	}
}

// What another consumer delivers to a service's inbox — any user who may
// create a consumer may aim one there — is not handled: only the
// service's own durable feeds it.
func TestRouterIgnoresAnotherConsumersDeliveries(t *testing.T) {
	s := setup(t)
	var handled atomic.Int32
	nc, js := s.Connect(t)
	stop := run(t, js, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		handled.Add(1)
		return nil, nil
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 && handled.Load() == 1 })

	// The same stored message, again, through a push consumer aimed at
	// every inbox the router's connection listens on.
	for _, inbox := range s.Inboxes(t, nc) {
		natstest.Deliver(t, s.JS, services.Stream, 0, inbox)
	}
	publish(t, s.JS, events.TaskSubject("t2", "in"), "x") // a real one, after the forged ones
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool {
		return ci.Delivered.Stream >= 2 && ci.NumAckPending == 0 && ci.NumPending == 0
	})
	stop()
	if n := handled.Load(); n != 2 {
		t.Fatalf("handled %d messages, want the 2 its own consumer delivered", n)
	}
}
