package services_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

const ackWait = time.Second

// While a handler outlives AckWait, another worker asking for the message
// gets nothing with the heartbeat, and the redelivery without it.
func TestHeartbeatKeepsTheMessage(t *testing.T) {
	for _, c := range []struct {
		name      string
		heartbeat services.Middleware
		stolen    bool
	}{
		{name: "heartbeat every AckWait/3", heartbeat: services.Heartbeat(ackWait / 3)},
		{name: "no heartbeat: redelivered", heartbeat: services.Heartbeat(0), stolen: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := setup(t)
			ctx := context.Background()
			cons, err := s.JS.CreateOrUpdateConsumer(ctx, services.Stream, jetstream.ConsumerConfig{
				Durable: "hb", FilterSubject: events.StageFilter("in"), AckPolicy: jetstream.AckExplicitPolicy,
				AckWait: ackWait, MaxDeliver: 5,
			})
			if err != nil {
				t.Fatal(err)
			}
			publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
			msg, err := cons.Next(jetstream.FetchMaxWait(patience))
			if err != nil {
				t.Fatal(err)
			}
			h := c.heartbeat(func(context.Context, *services.Msg) ([]services.Out, error) {
				// A long model call, during which another worker asks for
				// work for longer than AckWait.
				other, err := cons.Next(jetstream.FetchMaxWait(3 * ackWait))
				switch {
				case errors.Is(err, nats.ErrTimeout):
					return nil, nil
				case err != nil:
					return nil, err
				}
				md, _ := other.Metadata()
				return nil, fmt.Errorf("stolen: delivery %d", md.NumDelivered)
			})
			_, err = h(ctx, &services.Msg{Delivered: 1, InProgress: msg.InProgress})
			if stolen := err != nil; stolen != c.stolen {
				t.Fatalf("stolen = %v (%v), want %v", stolen, err, c.stolen)
			}
			if c.stolen {
				return
			}
			if err := msg.Ack(); err != nil {
				t.Fatal(err)
			}
			waitConsumer(t, s.JS, "hb", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 })
			if ci, _ := cons.Info(ctx); ci.NumRedelivered != 0 {
				t.Fatalf("%d redelivered", ci.NumRedelivered)
			}
		})
	}
}

// Under the router, a handler that runs three times AckWait, with a free
// worker beside it, is delivered once.
func TestRouterHeartbeatOutlivesAckWait(t *testing.T) {
	s := setup(t)
	var calls atomic.Int32
	delivered := make(chan int, 4)
	sp := spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		calls.Add(1)
		delivered <- m.Delivered
		time.Sleep(3 * ackWait)
		return nil, nil
	})
	sp.AckWait, sp.Concurrency = ackWait, 2
	run(t, s.JS, sp)
	publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
	if n := <-delivered; n != 1 {
		t.Fatalf("first delivery is %d", n)
	}
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 && ci.NumPending == 0 })
	c, err := s.JS.Consumer(context.Background(), services.Stream, "test")
	if err != nil {
		t.Fatal(err)
	}
	if ci, _ := c.Info(context.Background()); ci.NumRedelivered != 0 || calls.Load() != 1 {
		t.Fatalf("handled %d times, %d redelivered", calls.Load(), ci.NumRedelivered)
	}
}

// The heartbeat beats while the handler runs and never after it returned
// (by then the router may have acked the message). The clock is synctest's:
// 50 more intervals pass at once, and every timer due in them has fired.
func TestHeartbeatStopsWithTheHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var beats, late atomic.Int32
		var returned atomic.Bool
		thrice := make(chan struct{})
		m := &services.Msg{InProgress: func() error {
			if returned.Load() {
				late.Add(1)
			}
			if beats.Add(1) == 3 {
				close(thrice)
			}
			return nil
		}}
		h := services.Heartbeat(time.Millisecond)(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
			<-thrice
			return nil, nil
		})
		if _, err := h(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		returned.Store(true)
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if n := late.Load(); n != 0 {
			t.Fatalf("%d heartbeats after the handler returned", n)
		}
	})
}

// A beat that fails is tried again well before the next interval; while
// none gets through the ack window runs out, and before it does the
// handler's context is cancelled (cause ErrHeartbeatLost): the server is
// about to give the message to another worker, and this one stops rather
// than pay for the same pass beside it. A beat that gets through again in
// time keeps the handler running.
func TestHeartbeatThatFailsStopsTheHandlerBeforeTheWindowLapses(t *testing.T) {
	const every = time.Second // the router's AckWait/3: the window is 3s
	for _, tt := range []struct {
		name      string
		failFirst int32 // beats that fail before they get through
		lost      bool
	}{
		{"every beat fails", 1 << 30, true},
		{"two beats fail, the third gets through", 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var beats atomic.Int32
				var firstThrough time.Duration // since the start; 0: none
				start := time.Now()
				m := &services.Msg{InProgress: func() error {
					if beats.Add(1) <= tt.failFirst {
						return nats.ErrConnectionReconnecting
					}
					if firstThrough == 0 {
						firstThrough = time.Since(start)
					}
					return nil
				}}
				var stoppedAfter time.Duration
				h := services.Heartbeat(every)(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
					select {
					case <-ctx.Done(): // the model call is cut short
						stoppedAfter = time.Since(start)
						return nil, context.Cause(ctx)
					case <-time.After(10 * every): // a long model call
						return nil, nil
					}
				})
				_, err := h(context.Background(), m)
				if lost := errors.Is(err, services.ErrHeartbeatLost); lost != tt.lost {
					t.Fatalf("err = %v after %d beats; lost = %v, want %v", err, beats.Load(), lost, tt.lost)
				}
				if tt.lost && stoppedAfter >= 3*every {
					t.Errorf("stopped after %s: the window of 3s had lapsed", stoppedAfter)
				}
				if !tt.lost && firstThrough >= 3*every {
					t.Errorf("the first beat got through after %s: the window of 3s had lapsed; a failed beat must be tried again sooner", firstThrough)
				}
			})
		})
	}
}
