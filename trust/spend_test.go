package trust_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

func TestSpending(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	if _, err := services.Provision(ctx, srv.JS, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	s := trust.NewSpending(srv.JS, services.CounterStream)
	day1 := time.Date(2026, 5, 18, 23, 59, 0, 0, time.UTC)
	day2 := day1.Add(2 * time.Minute)

	if got, err := s.On(ctx, "css_fix", day1); err != nil || got != (trust.Spend{}) {
		t.Fatalf("nothing spent yet: %+v %v", got, err)
	}
	for _, add := range []struct {
		key    string
		at     time.Time
		tokens int
		cost   float64
	}{
		{"a:1:outcome", day1, 100, 0.25},
		{"b:1:outcome", day1, 50, 0},
		{"a:1:outcome", day1, 100, 0.25}, // a redelivery: counted once
		{"c:1:outcome", day2, 7, 0.000001},
	} {
		if err := s.Add(ctx, "css_fix", add.key, add.at, add.tokens, add.cost); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := s.On(ctx, "css_fix", day1); got.Tokens != 150 || trust.NanoUSD(got.Cost) != trust.NanoUSD(0.25) {
		t.Fatalf("day 1: %+v", got)
	}
	if got, _ := s.On(ctx, "css_fix", day2); got.Tokens != 7 || trust.NanoUSD(got.Cost) != 1000 {
		t.Fatalf("day 2: %+v", got)
	}
	all, err := s.All(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("All = %+v, %v", all, err)
	}
	d1 := all[[2]string{"css_fix", trust.Day(day1)}]
	if err := s.CorrectTo(ctx, d1, trust.DaySpend{Type: "css_fix", Day: d1.Day, Tokens: 120, NanoUSD: 5}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.On(ctx, "css_fix", day1); got.Tokens != 120 || trust.NanoUSD(got.Cost) != 5 {
		t.Fatalf("after the correction: %+v", got)
	}
	if err := s.Add(ctx, "CSS.fix", "k", day1, 1, 0); err == nil {
		t.Fatal("an invalid type was counted")
	}
}

// An outcome counted before a server restart and recorded again after it
// (its recorder was killed before the ack) is still counted once: the
// counter stream keeps the increments its dedup window is rebuilt from.
func TestSpendingAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	start := func() (*server.Server, jetstream.JetStream) {
		ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return ns, js
	}
	ctx := context.Background()
	ns, js := start()
	if _, err := services.Provision(ctx, js, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	for _, key := range []string{"a:1:outcome", "b:1:outcome"} {
		if err := trust.NewSpending(js, services.CounterStream).Add(ctx, "css_fix", key, at, 100, 0); err != nil {
			t.Fatal(err)
		}
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	ns, js = start()
	t.Cleanup(ns.Shutdown)
	s := trust.NewSpending(js, services.CounterStream)
	if err := s.Add(ctx, "css_fix", "a:1:outcome", at, 100, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := s.On(ctx, "css_fix", at); err != nil || got.Tokens != 200 {
		t.Fatalf("after a restart and a redelivery: %+v, %v; want 200 tokens", got, err)
	}
}
