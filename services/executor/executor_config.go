package executor

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	openai "github.com/sashabaranov/go-openai"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// DefaultModel is the model asked when neither the prompt, the type's policy
// nor Config.DefaultModel names one.
const DefaultModel = "gpt-4o-mini"

// Price is what a model costs, in USD per million tokens.
type Price struct {
	InputPerMTok  float64 `json:"input_per_mtok"`
	OutputPerMTok float64 `json:"output_per_mtok"`
}

// Cost is the USD cost of a call that used tokensIn and tokensOut.
func (p Price) Cost(tokensIn, tokensOut int) float64 {
	return (float64(tokensIn)*p.InputPerMTok + float64(tokensOut)*p.OutputPerMTok) / 1e6
}

// Config configures the executor.
type Config struct {
	// Model answers the prompts. Required: an *OpenAI, or Simulated when no
	// API key is configured.
	Model Model
	// AgentEnv names the environment variables an agent command gets
	// besides procgroup.DefaultEnv (its own API key, say;
	// DISPATCH_AGENT_ENV), CommandEnv those a command step gets
	// (DISPATCH_COMMAND_ENV). Nothing else of the executor's environment —
	// its model key, NATS password, state key — reaches a command.
	AgentEnv, CommandEnv []string
	// AgentLimits bound each process of an agent command (CPU time,
	// memory, open files; DISPATCH_AGENT_CPU, _MEMORY, _FILES),
	// CommandLimits each process of a command step (DISPATCH_COMMAND_*).
	// A command killed at its CPU time limit fails deterministically.
	// Default: none (the dispatch binary sets procgroup.DefaultLimits).
	AgentLimits, CommandLimits procgroup.Limits
	// DefaultModel is the model name asked when neither the prompt nor the
	// type's policy names one (DISPATCH_MODEL). Default "gpt-4o-mini".
	DefaultModel string
	// Policy gives each type's model, executor (model or command), agent
	// command, tools, tool-call and transient budgets and pipeline steps; the
	// prompt's own Model wins over the policy's. Default: nil, built-in
	// defaults (the model executor, no tools, no steps).
	Policy *policy.Source
	// Prices is the price table by model name, looked up with the requested
	// name and then the name the provider answered with. A model missing from
	// it costs 0. Default: empty.
	Prices map[string]Price
	// Tasks keeps the error discipline's facts in each task's state
	// (FailedRequests, Refused, TransientRetries), sets the task running
	// before anything is called, and lets the executor skip a prompt whose
	// task has moved on. Default: nil, the facts are kept in this instance's
	// memory only and no task state is touched.
	Tasks *services.TaskStore
	// NATS carries tool calls: each policy tool is requested on its subject.
	// Default: nil, no tools are offered (a warning is logged when a type
	// lists some).
	NATS *nats.Conn
	// Rules tune the error classification (see Classify). Default: the
	// built-in mapping; its clock is Now.
	Rules Rules
	// Backoff spaces the redeliveries after a transient failure without
	// Retry-After. Default: full jitter over 1s × 2^(n-1), capped at 5m.
	Backoff Backoff
	// ToolBackoff spaces the snoozes of an attempt waiting for a tool that
	// does not answer, with half jitter (Backoff.HalfJitter) so the type's
	// tool wait takes a bounded number of deliveries; a wait longer than 20
	// × Max raises the cap to a 20th of it. Default: 1s × 2^(n-1), capped at
	// 1m (the default 10m wait takes at most 26 deliveries, any wait about 60).
	ToolBackoff Backoff
	// Circuit configures the breaker kept per model (at its endpoint) and
	// per agent command, and how long a model whose deployment is wrong is
	// not called. Default: open after 5 transient failures within 1m, for
	// 30s, doubling up to 5m while probes fail; a wrong deployment 1h.
	Circuit CircuitConfig
	// ModelStates is the bucket (dispatch_models) where every executor
	// instance keeps the models' circuits and the marks of deployments found
	// wrong, so that one instance's cool-down holds for all. Default: nil,
	// this instance's memory.
	ModelStates jetstream.KeyValue
	// BaseURL and APIKey are the endpoint and key of a policy chain's
	// model that names no base_url or no credential (DISPATCH_OPENAI_BASE_URL,
	// DISPATCH_OPENAI_API_KEY); a model naming neither is asked through
	// Model. Default: Model's endpoint (Endpointer), no key.
	BaseURL, APIKey string
	// Credential returns the key a chain's model names (policy
	// Model.Credential). Default: the environment variable
	// DISPATCH_CREDENTIAL_<NAME> (policy.CredentialEnv).
	Credential func(name string) (string, bool)
	// Dial makes the model calling an endpoint with a key, for a chain's
	// model with a base_url or credential of its own; it is called once per
	// endpoint and key. Default: NewOpenAI.
	Dial func(baseURL, apiKey string) Model
	// Rand draws the backoff jitter, uniform in [0,1). Default
	// math/rand/v2.Float64.
	Rand func() float64
	// Registry receives the executor's Prometheus metrics. Default: nil, no
	// metrics are registered.
	Registry prometheus.Registerer
	// TypeLabels bounds the type label of the executor's metrics: the types
	// Policy names and the first services.DefaultMaxTypeLabels others get
	// their own, the rest "other". The services of one process share one
	// (mesh does). Default: a set of the executor's own.
	TypeLabels *services.LabelSet
	// Instance names this instance in the events it produces (By).
	// Default "executor".
	Instance string
	// Log receives one line per attempt and per snooze. Default slog.Default().
	Log *slog.Logger
	// Now is the clock (event times, durations, circuit cool-downs,
	// Retry-After dates). Default time.Now.
	Now func() time.Time
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.Model == nil {
		errs = append(errs, errors.New("executor: Model is required"))
	}
	for name, p := range c.Prices {
		if p.InputPerMTok < 0 || p.OutputPerMTok < 0 {
			errs = append(errs, fmt.Errorf("executor: price of %q must not be negative", name))
		}
	}
	for name, b := range map[string]Backoff{"Backoff": c.Backoff, "ToolBackoff": c.ToolBackoff} {
		if b.Base < 0 || b.Max < 0 || b.Factor < 0 || (b.Factor != 0 && b.Factor < 1) {
			errs = append(errs, fmt.Errorf("executor: %s needs Base and Max ≥ 0 and Factor 0 (default) or ≥ 1", name))
		}
	}
	for code, class := range c.Rules.Status {
		switch class {
		case events.ErrorClassTransient, events.ErrorClassDeterministic, events.ErrorClassAuth, events.ErrorClassQuota,
			events.ErrorClassConfig, events.ErrorClassModel:
		default:
			errs = append(errs, fmt.Errorf("executor: Rules.Status[%d] is %q, want transient, deterministic, auth, quota, config or model", code, class))
		}
	}
	for name, l := range map[string]procgroup.Limits{"AgentLimits": c.AgentLimits, "CommandLimits": c.CommandLimits} {
		if err := l.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("executor: %s: %w", name, err))
		}
	}
	if c.Circuit.CoolDown < 0 || c.Circuit.MaxCoolDown < 0 || c.Circuit.Window < 0 || c.Circuit.DeadFor < 0 {
		errs = append(errs, errors.New("executor: Circuit cool-downs, window and dead time must not be negative"))
	}
	return errors.Join(errs...)
}

// modelLabels bounds the model label: the priced models and the default
// one get their own, and the first maxModelLabels others.
func (c Config) modelLabels() *services.LabelSet {
	return services.NewLabelSet(maxModelLabels, func(model string) bool {
		_, priced := c.Prices[model]
		return priced || model == c.DefaultModel
	})
}

// routeLabels bounds the label of the per-model metrics: the names of
// the policy's chains, the priced models and the default one get their
// own, and the first maxModelLabels others.
func (c Config) routeLabels() *services.LabelSet {
	return services.NewLabelSet(maxModelLabels, func(name string) bool {
		_, priced := c.Prices[name]
		return priced || name == c.DefaultModel || chainNames(c.Policy.File(), name)
	})
}

// chainNames reports whether a chain of f names a model name.
func chainNames(f *policy.File, name string) bool {
	if f == nil {
		return false
	}
	for _, m := range f.Defaults.Chain() {
		if m.Name == name {
			return true
		}
	}
	for _, t := range f.Types {
		for _, m := range t.Chain() {
			if m.Name == name {
				return true
			}
		}
	}
	return false
}

func (c Config) withDefaults() Config {
	if c.Credential == nil {
		c.Credential = func(name string) (string, bool) { return os.LookupEnv(policy.CredentialEnv(name)) }
	}
	if c.Dial == nil {
		c.Dial = func(baseURL, apiKey string) Model { return NewOpenAI(OpenAIConfig{BaseURL: baseURL, APIKey: apiKey}) }
	}
	if c.BaseURL == "" {
		if e, ok := c.Model.(Endpointer); ok {
			c.BaseURL = e.Endpoint()
		} else {
			c.BaseURL = openai.DefaultConfig("").BaseURL
		}
	}
	if c.TypeLabels == nil {
		c.TypeLabels = services.NewLabelSet(services.DefaultMaxTypeLabels, c.Policy.Names)
	}
	if c.DefaultModel == "" {
		c.DefaultModel = DefaultModel
	}
	if c.Instance == "" {
		c.Instance = "executor"
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.ToolBackoff.Max == 0 {
		c.ToolBackoff.Max = DefaultToolBackoffMax
	}
	return c
}
