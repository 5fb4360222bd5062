package gate

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/services"
)

// metrics are the gate's Prometheus metrics; registered only when
// Config.Registry is set.
//
//	dispatch_gate_decisions_total{type,cause}  every pass the gate let go or
//	  stopped, by cause: trusted, unproven (a canary), exempt, reviewed,
//	  probe, trust and budget (blocked: needs_human_review), rung_rate
//	  (handed off); a probe is cause="probe". Counted once per pass: when
//	  the event carrying the decision is stored, not again when a
//	  redelivered pass republishes it (services.OnStored)
//	dispatch_gate_waits_total{type}            looks of a pass waiting for its type's canaries or a rung's
//	dispatch_gate_held_total{type}             tasks held for their type's trust (status held)
//	dispatch_gate_wakes_total{type,why}        held passes the sweeper woke: readmit, probe, expired, canary, queued, rung
//	dispatch_gate_asleep{type}                 passes asleep in the held index, as this
//	  gate's sweeper sees it (read at each scrape)
//	dispatch_trust_score{type}                 the type's trust score now, read at each
//	  scrape from the gate's view of the outcome stream (trustCollector)
//	dispatch_trust_outcomes{type}              the outcomes in the type's window now (idem)
//
// The type label is bounded (Config.TypeLabels): past its limit a type not
// named in the policy counts as type="other", and has no trust series.
type metrics struct {
	decisions *prometheus.CounterVec // type, cause
	waits     *prometheus.CounterVec // type
	held      *prometheus.CounterVec // type
	wakes     *prometheus.CounterVec // type, why
	tasks     *services.TaskMetrics
	types     *services.LabelSet
	shadow    *services.ShadowMetrics
}

func newMetrics(cfg Config, s *Service) *metrics {
	reg := cfg.Registry
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_gate_decisions_total",
			Help: "Passes the gate let through or stopped, by type and cause (trusted, unproven, exempt, reviewed, probe, trust, budget, rung_rate); a redelivered pass counts once.",
		}, []string{"type", "cause"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_gate_waits_total",
			Help: "Looks of a pass held back while its type's canaries, or the retries measuring its rung, decide, by type (each is a snooze: no tokens, not an attempt).",
		}, []string{"type"}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_gate_held_total",
			Help: "Passes held for their type's low trust (status held: no tokens, re-admitted when the type recovers), by type; a pass counts once.",
		}, []string{"type"}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_gate_wakes_total",
			Help: "Held passes the gate's sweeper woke from the held index, by type and why (readmit, probe, expired, canary, queued, rung).",
		}, []string{"type", "why"}),
		tasks:  services.NewTaskMetrics(reg, cfg.TypeLabels),
		types:  cfg.TypeLabels,
		shadow: services.NewShadowMetrics(reg, cfg.TypeLabels),
	}
	if reg != nil {
		m.decisions = services.Register(reg, m.decisions)
		m.waits = services.Register(reg, m.waits)
		m.held = services.Register(reg, m.held)
		m.wakes = services.Register(reg, m.wakes)
		if cfg.Held != nil {
			services.Register(reg, prometheus.Collector(&asleepCollector{s: s, types: cfg.TypeLabels}))
		}
		if all, ok := cfg.View.(allStats); ok {
			services.Register(reg, newTrustCollector(all, cfg.Policy, cfg.Scoring, cfg.TypeLabels))
		}
	}
	return m
}

// asleepCollector reports dispatch_gate_asleep{type} from the sweeper's
// copy of the held index: memory only.
type asleepCollector struct {
	s     *Service
	types *services.LabelSet
}

var asleepDesc = prometheus.NewDesc("dispatch_gate_asleep",
	"Passes held for trust asleep in the held index, by type, as this gate's sweeper sees it.", []string{"type"}, nil)

// Describe implements prometheus.Collector.
func (c *asleepCollector) Describe(ch chan<- *prometheus.Desc) { ch <- asleepDesc }

// Collect implements prometheus.Collector.
func (c *asleepCollector) Collect(ch chan<- prometheus.Metric) {
	byLabel := map[string]int{}
	for typ, n := range c.s.Asleep() {
		byLabel[c.types.Label(typ)] += n
	}
	for label, n := range byLabel {
		ch <- prometheus.MustNewConstMetric(asleepDesc, prometheus.GaugeValue, float64(n), label)
	}
}
