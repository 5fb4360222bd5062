package services

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the router's Prometheus metrics, per service: throughput by
// result, handler latency, publications and redeliveries. A nil *Metrics
// records nothing.
type Metrics struct {
	Messages  *prometheus.CounterVec
	Latency   *prometheus.HistogramVec
	Published *prometheus.CounterVec
	// Redeliveries counts the messages a service received again
	// (Delivered > 1): after a snooze (a nak with a delay: canary waits,
	// transient errors, parked tasks), a failure (a nak) or a worker that
	// died or did not settle in time (AckWait).
	Redeliveries *prometheus.CounterVec
	// Foreign counts the messages another consumer delivered to a
	// service's inbox, which it ignored (see Router.handle).
	Foreign *prometheus.CounterVec
}

// NewMetrics registers the router metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_messages_total",
			Help: "Messages handled per service, by result (ok, snoozed, retried, dead, shutdown).",
		}, []string{"service", "result"}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dispatch_handler_seconds",
			Help:    "Time a service's handler took per message.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"service"}),
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_published_total",
			Help: "Messages published per service; duplicate=true when the stream deduplicated a republish.",
		}, []string{"service", "duplicate"}),
		Redeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_redeliveries_total",
			Help: "Messages a service received again (delivered more than once: after a snooze, a failure, or a worker that died or ran past AckWait), per service.",
		}, []string{"service"}),
		Foreign: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_foreign_messages_total",
			Help: "Messages another consumer delivered to a service's inbox, ignored: someone who may create consumers aimed one at it.",
		}, []string{"service"}),
	}
	reg.MustRegister(m.Messages, m.Latency, m.Published, m.Redeliveries, m.Foreign)
	return m
}

func (m *Metrics) count(service string, result Result) {
	if m != nil {
		m.Messages.WithLabelValues(service, string(result)).Inc()
	}
}

func (m *Metrics) foreign(service string) {
	if m != nil {
		m.Foreign.WithLabelValues(service).Inc()
	}
}

func (m *Metrics) observe(service string, seconds float64) {
	if m != nil {
		m.Latency.WithLabelValues(service).Observe(seconds)
	}
}

func (m *Metrics) published(service string, dup bool) {
	if m != nil {
		d := "false"
		if dup {
			d = "true"
		}
		m.Published.WithLabelValues(service, d).Inc()
	}
}

// received counts a delivery of a message: a redelivery when delivered > 1.
func (m *Metrics) received(service string, delivered int) {
	if m != nil && delivered > 1 {
		m.Redeliveries.WithLabelValues(service).Inc()
	}
}
