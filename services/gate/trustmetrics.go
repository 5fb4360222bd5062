package gate

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// allStats is what the trust collector reads of the gate's view: every
// type's trust (*trust.View implements it).
type allStats interface {
	All() []trust.Stats
}

// trustCollector reports, at each scrape, every type's trust as the gate
// scores it now — from its view of the outcome stream, each type under its
// current policy (policy.Type.Scoring over the gate's defaults), as a pass
// would be scored:
//
//	dispatch_trust_score{type}     the score, for a type with at least
//	                               MinOutcomes outcomes in its window (a
//	                               type too new to be scored has none)
//	dispatch_trust_outcomes{type}  the tasks in its window (0 for a type
//	                               with gate facts and no outcome yet)
//
// Nothing is set at a decision: a type reports its score from the start
// (after a restart too) and between decisions, and every gate instance
// follows the same stream, so all report the same values (aggregate with
// max by (type)). A type without a label of its own (types: past the
// limit, not named in the policy) is not reported: a score cannot be
// summed into "other".
type trustCollector struct {
	view     allStats
	policy   *policy.Source
	scoring  trust.Policy
	types    *services.LabelSet
	score    *prometheus.Desc
	outcomes *prometheus.Desc
}

func newTrustCollector(view allStats, pol *policy.Source, scoring trust.Policy, types *services.LabelSet) *trustCollector {
	return &trustCollector{
		view: view, policy: pol, scoring: scoring, types: types,
		score: prometheus.NewDesc("dispatch_trust_score",
			"A task type's trust score now (0.6 × overall + 0.4 × recency-weighted success over its window), as the gate scores it; only types with enough outcomes to be scored.",
			[]string{"type"}, nil),
		outcomes: prometheus.NewDesc("dispatch_trust_outcomes",
			"Tasks in a task type's trust window now (at most its window, 50 by default; a task's attempts count once), as the gate sees them.",
			[]string{"type"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *trustCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.score
	ch <- c.outcomes
}

// Collect implements prometheus.Collector: it reads memory only.
func (c *trustCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.policy.Snapshot()
	for _, st := range c.view.All() {
		if !c.types.Own(st.Type) {
			continue
		}
		p := snap.For(st.Type).Scoring(c.scoring).WithDefaults()
		v := p.Evaluate(st.Type, st)
		ch <- prometheus.MustNewConstMetric(c.outcomes, prometheus.GaugeValue, float64(v.Outcomes), st.Type)
		if !v.Unproven {
			ch <- prometheus.MustNewConstMetric(c.score, prometheus.GaugeValue, v.Score, st.Type)
		}
	}
}
