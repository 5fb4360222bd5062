package services_test

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dispatchmesh/dispatchmesh/services"
)

// Each message is counted once, by what becomes of it.
func TestOutcomes(t *testing.T) {
	m := services.NewMetrics(prometheus.NewPedanticRegistry())
	var stats services.RunStats
	fate := func(r services.Result) error {
		return &services.Fate{Action: services.ActionNak, Result: r, Err: errors.New("x")}
	}
	for _, err := range []error{
		nil, nil,
		fate(services.ResultSnoozed),
		fate(services.ResultRetried),
		errors.New("no fate: retried"),
		&services.Fate{Action: services.ActionTerm, Reason: "poison", Result: services.ResultDead, Err: errors.New("x")},
		fate(services.ResultShutdown),
		fate(services.ResultNone), // comes back: not counted
	} {
		_, got := services.Outcomes(m, &stats, "svc")(func(context.Context, *services.Msg) ([]services.Out, error) {
			return nil, err
		})(context.Background(), &services.Msg{})
		if got != err {
			t.Fatalf("error %v changed to %v", err, got)
		}
	}
	for result, want := range map[string]float64{"ok": 2, "snoozed": 1, "retried": 2, "dead": 1, "shutdown": 1} {
		if got := testutil.ToFloat64(m.Messages.WithLabelValues("svc", result)); got != want {
			t.Errorf("dispatch_messages_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	if n := testutil.CollectAndCount(m.Messages); n != 5 {
		t.Errorf("%d series, want 5", n)
	}
	if c := stats.Counts(); c.Handled != 7 || c.Errors != 3 {
		t.Errorf("stats %+v, want 7 handled, 3 errors", c)
	}
	// Nil metrics and stats count nothing.
	if _, err := services.Outcomes(nil, nil, "svc")(func(context.Context, *services.Msg) ([]services.Out, error) {
		return nil, nil
	})(context.Background(), &services.Msg{}); err != nil {
		t.Fatal(err)
	}
}
