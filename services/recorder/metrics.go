package recorder

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/spend"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Labels of dispatch_attempts_total and dispatch_retries_total: outcome is
// success, failure, or refused for a failure whose request was never sent
// (it repeated a request that had failed deterministically).
const outcomeRefused = "refused"

// metrics are the recorder's spend metrics: the Prometheus side of the
// figures `dispatch stats` reads from the task store, counted by the rules
// of package spend. They are always kept and registered only when
// Config.Registry is set.
//
// Each is counted once per outcome, when the recorder first records an
// attempt; a redelivered outcome finds its pass already recorded and counts
// nothing. A task is counted when an attempt ends it (status succeeded,
// blocked or failed), with the attempts and spend of the round that ended
// (spend.Round: a human's requeue starts a new round), so a requeued task's
// earlier spend is never counted twice. Unlike `dispatch stats`, which reads
// every task's current status, they do not see what happens outside the
// recorder: a human resolving a blocked task (its spend stays wasted here), a
// task the gate blocks or the verifier cancels after earlier attempts. (The
// recorder does count, in dispatch_tasks_finished_total{by="human"}, the
// tasks a human's review action ended — action.go — but moves no spend.)
//
// The figures, per type (sum by (type) (…), over a range such as [1d]; a
// type past the label limit, Config.TypeLabels, counts as type="other"):
//
//	wasted spend        increase(dispatch_wasted_cost_usd_total[1d]), increase(dispatch_wasted_tokens_total[1d])
//	retry success rate  rate(dispatch_retries_total{outcome="success"}[1d]) / rate(dispatch_retries_total[1d])
//	loop rate           rate(dispatch_resolved_attempts_sum[1d]) / rate(dispatch_resolved_attempts_count[1d])
//	cost per resolved   rate(dispatch_resolved_cost_usd_total[1d]) / rate(dispatch_resolved_attempts_count[1d])
//	tokens per resolved rate(dispatch_resolved_tokens_total[1d]) / rate(dispatch_resolved_attempts_count[1d])
//	repeat-call rate    rate(dispatch_attempts_total{outcome="refused"}[1d]) / rate(dispatch_attempts_total[1d])
//	same-error retries  increase(dispatch_same_error_retries_total[1d])
//
// The executor's dispatch_prompt_tokens histogram gives the prompt tokens
// per model call on each rung: rate(…_sum[1d]) / rate(…_count[1d]) by (type, rung).
type metrics struct {
	tasks            *services.TaskMetrics
	attempts         *prometheus.CounterVec   // type, rung, outcome
	retries          *prometheus.CounterVec   // type, rung, outcome
	sameError        *prometheus.CounterVec   // type
	wastedTokens     *prometheus.CounterVec   // type
	wastedCost       *prometheus.CounterVec   // type
	resolvedTokens   *prometheus.CounterVec   // type
	resolvedCost     *prometheus.CounterVec   // type
	resolvedAttempts *prometheus.HistogramVec // type
	types            *services.LabelSet
	shadow           *services.ShadowMetrics
}

func newMetrics(reg prometheus.Registerer, types *services.LabelSet) *metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &metrics{
		tasks:  services.NewTaskMetrics(reg, types),
		types:  types,
		shadow: services.NewShadowMetrics(reg, types),
		attempts: counter("dispatch_attempts_total",
			"Attempts recorded, by type, rung (none for pipeline steps) and outcome (success, failure, refused).", "type", "rung", "outcome"),
		retries: counter("dispatch_retries_total",
			"Attempts made after a failed attempt of the same task, by type, rung and outcome (success, failure, refused).", "type", "rung", "outcome"),
		sameError: counter("dispatch_same_error_retries_total",
			"Failed attempts whose reason equals the task's previous failure's, of any error class, by type.", "type"),
		wastedTokens: counter("dispatch_wasted_tokens_total",
			"Tokens (prompt and completion) spent by tasks that ended unresolved (blocked, failed), by type.", "type"),
		wastedCost: counter("dispatch_wasted_cost_usd_total",
			"USD spent by tasks that ended unresolved (blocked, failed), by type.", "type"),
		resolvedTokens: counter("dispatch_resolved_tokens_total",
			"Tokens (prompt and completion) spent by tasks that succeeded, by type.", "type"),
		resolvedCost: counter("dispatch_resolved_cost_usd_total",
			"USD spent by tasks that succeeded, by type.", "type"),
		resolvedAttempts: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dispatch_resolved_attempts",
			Help:    "Attempts a task that succeeded took (its round's), by type: _sum / _count is the loop rate, _count the tasks resolved.",
			Buckets: []float64{1, 2, 3, 4, 5, 6, 8, 10, 15, 20},
		}, []string{"type"}),
	}
	if reg == nil {
		return m
	}
	m.attempts = services.Register(reg, m.attempts)
	m.retries = services.Register(reg, m.retries)
	m.sameError = services.Register(reg, m.sameError)
	m.wastedTokens = services.Register(reg, m.wastedTokens)
	m.wastedCost = services.Register(reg, m.wastedCost)
	m.resolvedTokens = services.Register(reg, m.resolvedTokens)
	m.resolvedCost = services.Register(reg, m.resolvedCost)
	m.resolvedAttempts = services.Register(reg, m.resolvedAttempts)
	return m
}

// recorded counts the attempt Apply has just recorded (st's last record)
// and, when it ended the task, the task.
func (m *metrics) recorded(st *events.TaskState) {
	i := len(st.History) - 1
	if i < 0 {
		return
	}
	r := st.History[i]
	typ, rung, outcome := m.types.Label(st.Type), spend.RungLabel(r.Rung), r.Outcome
	if spend.Refused(r) {
		outcome = outcomeRefused
	}
	m.attempts.WithLabelValues(typ, rung, outcome).Inc()
	if spend.Retry(st.History, i) {
		m.retries.WithLabelValues(typ, rung, outcome).Inc()
	}
	if spend.SameError(st.History, i) {
		m.sameError.WithLabelValues(typ).Inc()
	}
	if !events.Terminal(st.Status) {
		return
	}
	m.tasks.Finish(st.Type, st.Status, services.EndedByRecorder, st.UpdatedAt.Sub(st.CreatedAt))
	n, spent := spend.Round(st)
	tokens, cost := float64(max(spent.TokensIn+spent.TokensOut, 0)), max(spent.Cost, 0)
	if spend.Resolved(st.Status) {
		m.resolvedTokens.WithLabelValues(typ).Add(tokens)
		m.resolvedCost.WithLabelValues(typ).Add(cost)
		m.resolvedAttempts.WithLabelValues(typ).Observe(float64(n))
		return
	}
	m.wastedTokens.WithLabelValues(typ).Add(tokens)
	m.wastedCost.WithLabelValues(typ).Add(cost)
}
