package executor

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"dispatchmesh/internal/policy"
	"dispatchmesh/services"
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
	// DefaultModel is the model name asked when neither the prompt nor the
	// type's policy names one (DISPATCH_MODEL). Default "gpt-4o-mini".
	DefaultModel string
	// Policy gives each type's model (policy.For(type).Model); the prompt's
	// own Model wins over it. Default: nil, no per-type models.
	Policy *policy.Source
	// Prices is the price table by model name, looked up with the requested
	// name and then the name the provider answered with. A model missing from
	// it costs 0. Default: empty.
	Prices map[string]Price
	// Tasks, when set, gets the task's status set to running before the model
	// is called, and lets the executor skip a prompt whose task has moved on.
	// Default: nil, no task state is touched.
	Tasks *services.TaskStore
	// Instance names this instance in the events it produces (By).
	// Default "executor".
	Instance string
	// Log receives one line per model call. Default slog.Default().
	Log *slog.Logger
	// Now is the clock. Default time.Now.
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
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
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
	return c
}
