package services

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the router's Prometheus metrics, per service: throughput by
// result and handler latency. A nil *Metrics records nothing.
type Metrics struct {
	Messages  *prometheus.CounterVec
	Latency   *prometheus.HistogramVec
	Published *prometheus.CounterVec
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
	}
	reg.MustRegister(m.Messages, m.Latency, m.Published)
	return m
}

func (m *Metrics) count(service string, result Result) {
	if m != nil {
		m.Messages.WithLabelValues(service, string(result)).Inc()
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
