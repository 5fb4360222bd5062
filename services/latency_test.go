package services_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/services"
)

// Every call is observed, whatever it returns, for at least as long as
// the handler ran.
func TestLatency(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := services.NewMetrics(reg)
	slow := func(err error) services.Handler {
		return func(context.Context, *services.Msg) ([]services.Out, error) {
			time.Sleep(20 * time.Millisecond)
			return nil, err
		}
	}
	for _, h := range []services.Handler{slow(nil), slow(errors.New("x")), services.Recoverer(panicky("boom"))} {
		_, _ = services.Latency(m, "svc")(h)(context.Background(), &services.Msg{})
	}
	_, _ = services.Latency(nil, "svc")(slow(nil))(context.Background(), &services.Msg{}) // nil records nothing
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "dispatch_handler_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if len(mf.GetMetric()) != 1 || h.GetSampleCount() != 3 || h.GetSampleSum() < 0.04 {
			t.Fatalf("%d series, %d samples summing to %fs; want 1, 3, at least 0.04s", len(mf.GetMetric()), h.GetSampleCount(), h.GetSampleSum())
		}
		return
	}
	t.Fatal("dispatch_handler_seconds not gathered")
}
