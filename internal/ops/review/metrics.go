package review

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultQueueGaugeInterval is how long a QueueGauge reuses a reading of
// the review queue unless QueueGaugeConfig.MinInterval says otherwise.
const DefaultQueueGaugeInterval = 5 * time.Second

// QueueGaugeConfig configures a QueueGauge. The zero value is the default.
type QueueGaugeConfig struct {
	// MinInterval is the least time between two readings of the review
	// queue: a scrape within it of the last reading reports that reading.
	// 0: DefaultQueueGaugeInterval; negative: every scrape reads the queue.
	MinInterval time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// QueueGauge is a Prometheus collector of the review queue: it reports the
// open items per reason (Client.OpenCounts) as
// dispatch_review_queue{reason}. Every reason of Reasons is reported, 0
// when none is open, and any other reason a newer service wrote. A reading
// reads only the review records and decisions stored since the previous
// one (a few requests however long the queue; the first reading of a
// process reads the headers of every record once), and is taken at most
// once per MinInterval: scrapes in between report the last reading. A
// reading that could not read the stream (or not all of what was new
// within its 5 s) reports nothing, and dispatch_review_queue_up 0; the
// next reading goes on from where it stopped.
type QueueGauge struct {
	readOpen func(context.Context) (map[string]int, error)
	timeout  time.Duration
	interval time.Duration
	now      func() time.Time
	queue    *prometheus.Desc
	up       *prometheus.Desc

	mu   sync.Mutex // held while reading: concurrent scrapes share one reading
	read time.Time  // when the last reading was taken; zero: never
	ok   bool       // the last reading read the queue
	open map[string]int
}

// NewQueueGauge collects c's review queue with the default configuration.
func NewQueueGauge(c *Client) *QueueGauge {
	return NewQueueGaugeConfig(c, QueueGaugeConfig{})
}

// NewQueueGaugeConfig collects c's review queue as cfg says.
func NewQueueGaugeConfig(c *Client, cfg QueueGaugeConfig) *QueueGauge {
	if cfg.MinInterval == 0 {
		cfg.MinInterval = DefaultQueueGaugeInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &QueueGauge{
		readOpen: c.OpenCounts, timeout: 5 * time.Second, interval: cfg.MinInterval, now: cfg.Now,
		queue: prometheus.NewDesc("dispatch_review_queue",
			"Review items waiting for a human, per reason (escalated, gated, stuck, poison, rejected).", []string{"reason"}, nil),
		up: prometheus.NewDesc("dispatch_review_queue_up",
			"1 when the last reading of the review queue succeeded, 0 when it could not read it.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (g *QueueGauge) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.queue
	ch <- g.up
}

// Collect implements prometheus.Collector.
func (g *QueueGauge) Collect(ch chan<- prometheus.Metric) {
	ok, open := g.reading()
	if !ok {
		ch <- prometheus.MustNewConstMetric(g.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(g.up, prometheus.GaugeValue, 1)
	for r, n := range open {
		ch <- prometheus.MustNewConstMetric(g.queue, prometheus.GaugeValue, float64(n), r)
	}
}

// reading returns the last reading of the queue, reading it again when
// that reading is MinInterval old (or there is none). The returned map is
// never written again: a new reading replaces it.
func (g *QueueGauge) reading() (bool, map[string]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := g.now(); g.read.IsZero() || g.interval < 0 || now.Sub(g.read) >= g.interval || now.Before(g.read) {
		ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
		open, err := g.readOpen(ctx)
		cancel()
		g.ok, g.open, g.read = err == nil, open, now
	}
	return g.ok, g.open
}
