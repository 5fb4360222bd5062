package services

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// A consumer deleted while no pull request waits on it gets no "consumer
// deleted" from the server, only silence: the puller notices the missing
// heartbeats, looks the consumer up and reports the iterator closed, so
// Run stops and says so. Both ways of pulling.
func TestPullerNoticesASilentlyDeletedConsumer(t *testing.T) {
	for _, onDemand := range []bool{false, true} {
		srv := natstest.Start(t)
		ctx := context.Background()
		stream, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
		if err != nil {
			t.Fatal(err)
		}
		cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "gone", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.DeleteConsumer(ctx, "gone"); err != nil { // before any pull request
			t.Fatal(err)
		}
		next, drain, err := puller(cons, Spec{OnDemand: onDemand, Concurrency: 1}, func() int { return 1 })
		if err != nil {
			t.Fatal(err)
		}
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			for {
				if _, err := next(); errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					return
				}
			}
		}()
		select {
		case <-closed:
		case <-time.After(time.Minute): // a deadlock guard, not a timing assertion
			t.Fatalf("OnDemand=%v: still pulling from a deleted consumer a minute later", onDemand)
		}
		drain()
	}
}
