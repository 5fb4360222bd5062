package review

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// QueueGauge is a Prometheus collector of the review queue: at each scrape
// it lists the queue (List with the zero Filter) and reports the open
// items per reason as dispatch_review_queue{reason}. Every reason of
// Reasons is reported, 0 when none is open, and any other reason a newer
// service wrote. A scrape that cannot read the queue reports nothing, and
// dispatch_review_queue_up 0.
type QueueGauge struct {
	c       *Client
	timeout time.Duration
	queue   *prometheus.Desc
	up      *prometheus.Desc
}

// NewQueueGauge collects c's review queue.
func NewQueueGauge(c *Client) *QueueGauge {
	return &QueueGauge{
		c: c, timeout: 5 * time.Second,
		queue: prometheus.NewDesc("dispatch_review_queue",
			"Review items waiting for a human, per reason (escalated, gated, stuck, poison, rejected).", []string{"reason"}, nil),
		up: prometheus.NewDesc("dispatch_review_queue_up",
			"1 when the last scrape read the review queue, 0 when it could not.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (g *QueueGauge) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.queue
	ch <- g.up
}

// Collect implements prometheus.Collector.
func (g *QueueGauge) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	q, err := g.c.List(ctx, Filter{})
	if err != nil {
		ch <- prometheus.MustNewConstMetric(g.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(g.up, prometheus.GaugeValue, 1)
	open := map[string]int{}
	for _, r := range Reasons {
		open[r] = 0
	}
	for r, n := range q.Counts {
		open[r] = n.Open
	}
	for r, n := range open {
		ch <- prometheus.MustNewConstMetric(g.queue, prometheus.GaugeValue, float64(n), r)
	}
}
