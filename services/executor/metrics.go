package executor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/spend"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// metrics are the executor's Prometheus metrics. They are always kept and
// registered only when Config.Registry is set; a second executor on the same
// registry shares the first one's collectors.
//
// Every label that comes from outside is bounded: a task's type by
// Config.TypeLabels, a model name (the provider's answer or an agent
// command's report) by models, and a tool by the tools the policy offers the
// attempt (toolLabel).
type metrics struct {
	transient    *prometheus.CounterVec   // endpoint
	snooze       *prometheus.HistogramVec // reason
	refused      *prometheus.CounterVec   // type
	sameError    *prometheus.CounterVec   // type
	errors       *prometheus.CounterVec   // type, class
	toolCalls    *prometheus.CounterVec   // tool
	toolRefusals *prometheus.CounterVec   // tool
	tokens       *prometheus.CounterVec   // model, type, direction
	cost         *prometheus.CounterVec   // model, type
	// prompt observes the prompt tokens of each model call.
	prompt *prometheus.HistogramVec // type, rung
	types  *services.LabelSet
	models *services.LabelSet
	// per model of a chain (route.name; an agent command's name): routes
	// bounds their label
	routes   *services.LabelSet
	calls    *prometheus.CounterVec // model
	mErrors  *prometheus.CounterVec // model, class
	cooldown *prometheus.CounterVec // model
	skips    *prometheus.CounterVec // model, reason
	circuit  *prometheus.GaugeVec   // model
	mTokens  *prometheus.CounterVec // model, direction
	mCost    *prometheus.CounterVec // model
}

// maxModelLabels is how many models, besides the priced ones and the
// default model, get a label of their own.
const maxModelLabels = 16

// toolUnknown is the tool label of a call to a tool the policy does not
// offer the attempt.
const toolUnknown = "unknown"

// Snooze reasons (label of dispatch_executor_snooze_seconds).
const (
	snoozeBackoff    = "backoff"     // a transient failure without Retry-After
	snoozeRetryAfter = "retry_after" // the provider asked for the delay
	snoozeCircuit    = "circuit"     // every model of the type (or the agent command) is cooling down
	snoozeToolWait   = "tool_wait"   // a tool did not answer
)

func newMetrics(reg prometheus.Registerer, types, models, routes *services.LabelSet) *metrics {
	m := &metrics{
		types: types, models: models, routes: routes,
		transient: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_executor_transient_retries_total",
			Help: "Transient failures (5xx, timeouts, resets, rate limits) answered with a snooze or, past the budget, a failed attempt, by endpoint.",
		}, []string{"endpoint"}),
		snooze: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dispatch_executor_snooze_seconds",
			Help:    "Delays of the snoozes the executor asked for, by reason (backoff, retry_after, circuit, tool_wait).",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
		}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_executor_refused_total",
			Help: "Requests not sent because they were identical to one that already failed deterministically, by task type.",
		}, []string{"type"}),
		sameError: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_executor_same_error_retries_total",
			Help: "Deterministic failures whose error equals the task's previous failure, by task type (a stuck loop).",
		}, []string{"type"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_executor_errors_total",
			Help: "Failed calls by task type and error class.",
		}, []string{"type", "class"}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_executor_tool_calls_total",
			Help: "Tool calls the model asked for, by tool (refused ones included; unknown: a tool the policy does not offer).",
		}, []string{"tool"}),
		toolRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_executor_tool_refusals_total",
			Help: "Tool calls refused for repeating a call that failed deterministically, by tool; refusals/calls is the repeat-call rate.",
		}, []string{"tool"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_executor_tokens_total",
			Help: "Tokens used by model calls, by model, task type and direction (in, out).",
		}, []string{"model", "type", "direction"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_executor_cost_usd_total",
			Help: "USD spent on model calls, by model and task type.",
		}, []string{"model", "type"}),
	}
	m.prompt = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "dispatch_prompt_tokens",
		Help: "Prompt tokens of each model call (every turn of a tool loop), by task type and rung (none for pipeline steps); " +
			"_sum / _count is the mean prompt per call.",
		Buckets: prometheus.ExponentialBuckets(256, 2, 11), // 256 … 262144
	}, []string{"type", "rung"})
	m.modelMetrics()
	if reg == nil {
		return m
	}
	m.registerModelMetrics(reg)
	m.transient = services.Register(reg, m.transient)
	m.snooze = services.Register(reg, m.snooze)
	m.refused = services.Register(reg, m.refused)
	m.sameError = services.Register(reg, m.sameError)
	m.errors = services.Register(reg, m.errors)
	m.toolCalls = services.Register(reg, m.toolCalls)
	m.toolRefusals = services.Register(reg, m.toolRefusals)
	m.tokens = services.Register(reg, m.tokens)
	m.cost = services.Register(reg, m.cost)
	m.prompt = services.Register(reg, m.prompt)
	return m
}

func (m *metrics) usage(model, taskType string, in, out int, cost float64) {
	model, taskType = m.models.Label(model), m.typ(taskType)
	m.tokens.WithLabelValues(model, taskType, "in").Add(float64(in))
	m.tokens.WithLabelValues(model, taskType, "out").Add(float64(out))
	m.cost.WithLabelValues(model, taskType).Add(cost)
}

// typ is the type label of taskType.
func (m *metrics) typ(taskType string) string { return m.types.Label(taskType) }

// toolLabel is the tool label of a call to name: name when the policy
// offers the attempt that tool (byName), else toolUnknown.
func toolLabel(byName map[string]policy.Tool, name string) string {
	if _, ok := byName[name]; ok {
		return name
	}
	return toolUnknown
}

// promptTokens observes one model call's prompt tokens. Agent commands
// report only their total, not per call, and are not observed.
func (m *metrics) promptTokens(taskType string, rung events.Rung, tokens int) {
	m.prompt.WithLabelValues(m.typ(taskType), spend.RungLabel(rung)).Observe(float64(tokens))
}

// modelMetrics makes the per-model metrics: their model label is a name of
// a policy chain's model (a known set), or the model of a type without a
// chain, or an agent command.
func (m *metrics) modelMetrics() {
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dispatch_model_calls_total",
		Help: "Calls sent to each model (the name in the type's models chain; the model of a type without one; an agent command).",
	}, []string{"model"})
	m.mErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dispatch_model_errors_total",
		Help: "Failed calls by model and error class.",
	}, []string{"model", "class"})
	m.cooldown = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dispatch_model_cooldowns_total",
		Help: "Cool-downs a call to the model began (its circuit opened), by model.",
	}, []string{"model"})
	m.skips = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dispatch_model_skips_total",
		Help: "Calls that passed a model over for the next one of the chain, by model and reason (cooling, dead, failed, refused, no_credential).",
	}, []string{"model", "reason"})
	m.circuit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dispatch_model_circuit_state",
		Help: "Circuit breaker state per model as this instance last saw it: 0 closed, 1 half-open, 2 open.",
	}, []string{"model"})
	m.mTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dispatch_model_tokens_total",
		Help: "Tokens used by each model, by direction (in, out).",
	}, []string{"model", "direction"})
	m.mCost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dispatch_model_cost_usd_total",
		Help: "USD spent on each model.",
	}, []string{"model"})
}

func (m *metrics) registerModelMetrics(reg prometheus.Registerer) {
	m.calls = services.Register(reg, m.calls)
	m.mErrors = services.Register(reg, m.mErrors)
	m.cooldown = services.Register(reg, m.cooldown)
	m.skips = services.Register(reg, m.skips)
	m.circuit = services.Register(reg, m.circuit)
	m.mTokens = services.Register(reg, m.mTokens)
	m.mCost = services.Register(reg, m.mCost)
}

// called counts one call to a model: its class ("" when it answered),
// the circuit's state after it, and whether it opened the circuit.
func (m *metrics) called(name string, class events.ErrorClass, state int, opened bool) {
	name = m.routes.Label(name)
	m.calls.WithLabelValues(name).Inc()
	if class != "" {
		m.mErrors.WithLabelValues(name, string(class)).Inc()
	}
	if opened {
		m.cooldown.WithLabelValues(name).Inc()
	}
	m.circuit.WithLabelValues(name).Set(float64(state))
}

func (m *metrics) circuitState(name string, state int) {
	m.circuit.WithLabelValues(m.routes.Label(name)).Set(float64(state))
}

func (m *metrics) skip(name, reason string) {
	m.skips.WithLabelValues(m.routes.Label(name), reason).Inc()
}

func (m *metrics) routeUsage(name string, in, out int, cost float64) {
	name = m.routes.Label(name)
	m.mTokens.WithLabelValues(name, "in").Add(float64(in))
	m.mTokens.WithLabelValues(name, "out").Add(float64(out))
	m.mCost.WithLabelValues(name).Add(cost)
}
