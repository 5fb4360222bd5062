package services

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// ConsumerStats is a Prometheus collector that reads, at each scrape, the
// state of the stage consumers of the services in a process from the server
// (consumer info): how many messages wait for the stage, how many are in
// flight, and how many were delivered again. Two processes running the same
// service report the same durable consumer: aggregate with max by (service).
type ConsumerStats struct {
	js        jetstream.JetStream
	consumers []string // durable names (each on its StreamOf)
	timeout   time.Duration

	pending, ackPending, redelivered *prometheus.Desc
}

// NewConsumerStats collects the state of the named durable consumers.
func NewConsumerStats(js jetstream.JetStream, consumers ...string) *ConsumerStats {
	labels := []string{"service"}
	return &ConsumerStats{
		js: js, consumers: consumers, timeout: 2 * time.Second,
		pending: prometheus.NewDesc("dispatch_consumer_pending",
			"Messages on the stream waiting for the stage's consumer (queue depth).", labels, nil),
		ackPending: prometheus.NewDesc("dispatch_consumer_ack_pending",
			"Messages delivered to the stage and not yet acknowledged (in flight).", labels, nil),
		redelivered: prometheus.NewDesc("dispatch_consumer_redelivered",
			"Messages in flight that were delivered more than once (snoozed, retried or redelivered after a crash).", labels, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ConsumerStats) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	ch <- c.redelivered
}

// Collect implements prometheus.Collector. A consumer whose info cannot be
// read is left out of this scrape.
func (c *ConsumerStats) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	for _, name := range c.consumers {
		cons, err := c.js.Consumer(ctx, StreamOf(name), name)
		if err != nil {
			continue
		}
		info := cons.CachedInfo() // read by Consumer just now
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(info.NumPending), name)
		ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(info.NumAckPending), name)
		ch <- prometheus.MustNewConstMetric(c.redelivered, prometheus.GaugeValue, float64(info.NumRedelivered), name)
	}
}
