package recorder_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"dispatchmesh/events"
	"dispatchmesh/history"
	"dispatchmesh/internal/natstest"
	"dispatchmesh/internal/policy"
	"dispatchmesh/services"
	"dispatchmesh/services/recorder"
	"dispatchmesh/trust"
)

// A recorder killed after its writes and before its ack gets the outcome
// again later, behind more outcomes of the type than the trust window
// holds: the type's daily spend and its trust window count it once
// (issue 9, defect 2).
func TestOutcomeRedeliveredBehindAFullWindowCountsOnce(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	stores, err := services.Provision(ctx, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	trustStore := trust.NewStore(stores.Trust, trust.Policy{})
	spending := trust.NewSpending(srv.JS, services.CounterStream)
	rec, err := recorder.New(recorder.Config{
		Tasks: services.NewTaskStore(stores.Tasks), Trust: trustStore, History: history.NewStore(stores.History, 0),
		Spending: spending, Policy: policy.Static(nil), Instance: "recorder@test",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	success := events.Result{Outcome: events.OutcomeSuccess, Approach: "fix", TokensIn: 100, TokensOut: 10, Cost: 0.001}
	first := executed(t, events.Task{ID: "first", Type: "css_fix", Subject: "a.css"}, 1, 1, events.RungRefine, success)
	if _, err := rec.Handle(ctx, first); err != nil {
		t.Fatal(err)
	}
	for i := range trust.DefaultWindow + 10 {
		m := executed(t, events.Task{ID: fmt.Sprintf("later-%d", i), Type: "css_fix", Subject: fmt.Sprintf("s%d.css", i)}, 1, 1, events.RungRefine, success)
		m.Time = m.Time.Add(time.Duration(i+1) * time.Millisecond)
		if _, err := rec.Handle(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	before, err := trustStore.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	first.Delivered = 2
	if _, err := rec.Handle(ctx, first); err != nil {
		t.Fatal(err)
	}
	after, err := trustStore.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after.Outcomes, before.Outcomes) {
		t.Fatal("the redelivered outcome changed the trust window")
	}
	got, err := spending.On(ctx, "css_fix", first.Time)
	if err != nil {
		t.Fatal(err)
	}
	outcomes := trust.DefaultWindow + 11
	if want := (trust.Spend{Tokens: 110 * outcomes, Cost: 0.001 * float64(outcomes)}); got.Tokens != want.Tokens || trust.NanoUSD(got.Cost) != trust.NanoUSD(want.Cost) {
		t.Fatalf("spent %+v, want %+v: the redelivered outcome counted twice", got, want)
	}
}
