package gate

import (
	"github.com/prometheus/client_golang/prometheus"

	"dispatchmesh/services"
)

// metrics are the gate's Prometheus metrics; registered only when
// Config.Registry is set.
//
//	dispatch_gate_decisions_total{type,cause}  every pass the gate let go or
//	  stopped, by cause: trusted, unproven (a canary), exempt, reviewed,
//	  probe, trust and budget (blocked: needs_human_review), rung_rate
//	  (handed off); a probe is cause="probe"
//	dispatch_gate_waits_total{type}            looks of a pass waiting for its type's canaries
//	dispatch_trust_score{type}                 the type's trust score at its latest gate decision
type metrics struct {
	decisions *prometheus.CounterVec // type, cause
	waits     *prometheus.CounterVec // type
	score     *prometheus.GaugeVec   // type
	tasks     *services.TaskMetrics
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_gate_decisions_total",
			Help: "Passes the gate let through or stopped, by type and cause (trusted, unproven, exempt, reviewed, probe, trust, budget, rung_rate).",
		}, []string{"type", "cause"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_gate_waits_total",
			Help: "Looks of a pass held back while its type's canaries decide, by type (each is a snooze: no tokens, not an attempt).",
		}, []string{"type"}),
		score: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dispatch_trust_score",
			Help: "A task type's trust score (0.6 × overall + 0.4 × recency-weighted success over its window) at its latest gate decision.",
		}, []string{"type"}),
		tasks: services.NewTaskMetrics(reg),
	}
	if reg != nil {
		m.decisions = services.Register(reg, m.decisions)
		m.waits = services.Register(reg, m.waits)
		m.score = services.Register(reg, m.score)
	}
	return m
}
