package review_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// gauges is every sample of the gauge's families, keyed by name and reason.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "/" + l.GetValue()
			}
			out[key] = m.GetGauge().GetValue()
		}
	}
	return out
}

// Scrapes within the gauge's interval share one listing of the queue; the
// first scrape after it lists the queue again and sees a new record.
func TestQueueGaugeReadsAtMostOncePerInterval(t *testing.T) {
	s := newSeeded(t)
	gate := func(id string) {
		base := events.Base{Task: events.Task{ID: id, Type: "css_fix", Subject: "s"}, Run: events.Run{Pass: 1, Attempt: 1}}
		s.publish(events.ReviewSubject(events.ReviewGated, id), events.EventGated, nil, events.Gated{Base: base})
		s.put(events.TaskState{ID: id, Type: "css_fix", Subject: "s", Status: events.StatusNeedsHumanReview, Pass: 1})
	}
	gate("g-1")

	now := time.Unix(1_700_000_000, 0)
	g := review.NewQueueGaugeConfig(s.rc, review.QueueGaugeConfig{MinInterval: 10 * time.Second, Now: func() time.Time { return now }})
	listings := review.CountListings(g)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(g)

	want := func(step string, gated float64, n int64) {
		t.Helper()
		m := gauges(t, reg)
		if m["dispatch_review_queue_up"] != 1 || m["dispatch_review_queue/"+events.ReviewGated] != gated || len(m) != 1+len(review.Reasons) {
			t.Errorf("%s: scraped %v, want up 1 and %v gated", step, m, gated)
		}
		if got := listings.Load(); got != n {
			t.Errorf("%s: %d listings of the queue, want %d", step, got, n)
		}
	}
	want("first scrape", 1, 1)
	gate("g-2")
	want("second scrape at the same time", 1, 1)
	now = now.Add(9 * time.Second)
	want("a scrape within the interval", 1, 1)
	now = now.Add(time.Second)
	want("a scrape once the interval passed", 2, 2)
	want("the scrape after it", 2, 2)
}

// A reading that cannot read the queue reports only dispatch_review_queue_up
// 0, until a reading after the interval can.
func TestQueueGaugeUp(t *testing.T) {
	s := newSeeded(t)
	if err := s.srv.JS.DeleteStream(bg, services.Stream); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	g := review.NewQueueGaugeConfig(s.rc, review.QueueGaugeConfig{Now: func() time.Time { return now }})
	listings := review.CountListings(g)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(g)
	if m := gauges(t, reg); len(m) != 1 || m["dispatch_review_queue_up"] != 0 {
		t.Fatalf("without the stream: scraped %v, want only up 0", m)
	}
	if _, err := services.Provision(bg, s.srv.JS, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if m := gauges(t, reg); len(m) != 1 || m["dispatch_review_queue_up"] != 0 || listings.Load() != 1 {
		t.Fatalf("within the interval: scraped %v after %d listings, want the failed reading again", m, listings.Load())
	}
	now = now.Add(review.DefaultQueueGaugeInterval)
	if m := gauges(t, reg); m["dispatch_review_queue_up"] != 1 || m["dispatch_review_queue/"+events.ReviewGated] != 0 || listings.Load() != 2 {
		t.Fatalf("after the interval: scraped %v after %d listings, want up 1 and every reason 0", m, listings.Load())
	}
}
