package services_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// runCounted starts a router with metrics on reg for spec.
func runCounted(t *testing.T, js jetstream.JetStream, reg prometheus.Registerer, spec services.Spec) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := &services.Router{JS: js, Instance: "test@here", Log: quiet, Grace: 10 * time.Second, Metrics: services.NewMetrics(reg)}
	go func() { done <- r.Run(ctx, spec) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	})
}

// dispatch_redeliveries_total counts every delivery after a message's
// first — a failure's, a snooze's — and OnStored runs what a handler
// decided once its output is stored as new: not for a delivery that
// failed or snoozed, not for a republish the stream deduplicated.
func TestRouterCountsRedeliveriesAndStoredDecisions(t *testing.T) {
	s := setup(t)
	reg := prometheus.NewPedanticRegistry()
	var (
		mu      sync.Mutex
		decided = map[string]int{} // task id → OnStored runs
		calls   atomic.Int32
	)
	out := func(id string) services.Out {
		o, err := services.Emit(events.TaskSubject(id, "out"), id+":1:out", "test.v1", id, "x")
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	// t-dup's output was stored before (a first delivery that crashed
	// after its publish): its delivery republishes it, deduplicated.
	if _, err := s.JS.PublishMsg(context.Background(), services.NatsMsg(out("t-dup")), jetstream.WithMsgID(out("t-dup").MsgID)); err != nil {
		t.Fatal(err)
	}
	runCounted(t, s.JS, reg, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		calls.Add(1)
		id := m.Header.Get(events.HeaderTaskID)
		services.OnStored(ctx, func() { mu.Lock(); decided[id]++; mu.Unlock() })
		switch {
		case id == "t-fail" && m.Delivered == 1:
			return []services.Out{out(id)}, errors.New("fails once")
		case id == "t-snooze" && m.Delivered == 1:
			return nil, services.Snooze(20*time.Millisecond, errors.New("not yet"))
		case id == "t-none":
			return nil, nil
		}
		return []services.Out{out(id)}, nil
	}))
	for _, id := range []string{"t-ok", "t-fail", "t-snooze", "t-dup", "t-none"} {
		msg := nats.NewMsg(events.TaskSubject(id, "in"))
		msg.Header.Set(events.HeaderTaskID, id)
		if _, err := s.JS.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool {
		return ci.NumAckPending == 0 && ci.NumPending == 0 && calls.Load() == 7
	})
	mu.Lock()
	defer mu.Unlock()
	for id, want := range map[string]int{"t-ok": 1, "t-fail": 1, "t-snooze": 1, "t-dup": 0, "t-none": 0} {
		if decided[id] != want {
			t.Errorf("%s: OnStored ran %d times, want %d", id, decided[id], want)
		}
	}
	if got := counterValue(t, reg, "dispatch_redeliveries_total", "test"); got != 2 {
		t.Errorf("dispatch_redeliveries_total{service=test} = %v, want 2 (t-fail and t-snooze, once each)", got)
	}
}

// Outside a router, OnStored runs at once.
func TestOnStoredWithoutARouter(t *testing.T) {
	ran := false
	services.OnStored(context.Background(), func() { ran = true })
	if !ran {
		t.Fatal("OnStored did not run outside a router")
	}
}

// counterValue is the value of the one series of a counter family with
// the given label values, in the order of the family's label names.
func counterValue(t *testing.T, g prometheus.Gatherer, name string, values ...string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(values) {
				continue
			}
			for i, l := range m.GetLabel() {
				if l.GetValue() != values[i] {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, values)
	return 0
}
