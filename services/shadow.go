package services

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// ShadowMetrics count the decisions made under the shadow policy beside
// the live ones:
//
//	dispatch_shadow_decisions_total{type,live,shadow}  each gate decision
//	  (admit, hold, block, handoff) and each recorder decision after an
//	  attempt (succeeded, retry, park, handoff, fail, stuck), by what the
//	  live policy decided and what the shadow policy would have; counted
//	  once per decision. The type label is bounded (LabelSet); live and
//	  shadow take only those values.
type ShadowMetrics struct {
	decisions *prometheus.CounterVec
	types     *LabelSet
}

// NewShadowMetrics registers the shadow counter on reg (nil: counts
// nothing), shared by the gate and the recorder of one process.
func NewShadowMetrics(reg prometheus.Registerer, types *LabelSet) *ShadowMetrics {
	m := &ShadowMetrics{types: types, decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dispatch_shadow_decisions_total",
		Help: "Decisions of the gate and the recorder under the live policy and, never enforced, under the shadow policy (dispatch policy shadow), by type, live and shadow decision.",
	}, []string{"type", "live", "shadow"})}
	if reg != nil {
		m.decisions = Register(reg, m.decisions)
	}
	return m
}

// Count counts one decision; a nil shadow (no shadow policy) counts nothing.
func (m *ShadowMetrics) Count(taskType, live string, shadow *events.ShadowDecision) {
	if m == nil || shadow == nil {
		return
	}
	m.decisions.WithLabelValues(m.types.Label(taskType), live, shadow.Act).Inc()
}
