package prompt

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// Config configures the prompt builder.
type Config struct {
	// History is the outcome history. Required.
	History History
	// Policy gives each task type's template and model. Nil serves the
	// built-in defaults: DefaultTemplate and DefaultModel.
	Policy *policy.Source
	// HistoryN is how many previous outcomes for (type, subject) a prompt
	// carries. Default 5 (DefaultHistoryN), at most history.Keep.
	HistoryN int
	// Ladder holds the recurring-failure rule: a new task whose (type,
	// subject) failed 3+ times in the last 7 days starts on PIVOT (at most
	// history.Keep failures: the history keeps that many).
	Ladder ladder.Config
	// DefaultModel is the prompt's model when the type's policy names none.
	// Default "": the executor then uses its own default model.
	DefaultModel string
	// Instance names this instance in the events it publishes (By).
	// Default "".
	Instance string
	// Log receives the service's logs. Default slog.Default().
	Log *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Validate reports every problem with the config at once.
func (c Config) Validate() error {
	var errs []error
	if c.History == nil {
		errs = append(errs, errors.New("prompt: config: History is required"))
	}
	if c.HistoryN < 0 || c.HistoryN > history.Keep {
		errs = append(errs, fmt.Errorf("prompt: config: HistoryN %d must be 0-%d (the history keeps %d outcomes per subject)", c.HistoryN, history.Keep, history.Keep))
	}
	if n := c.Ladder.RecurringFailures; n > history.Keep {
		errs = append(errs, fmt.Errorf("prompt: config: Ladder.RecurringFailures %d must be at most %d (the history keeps %d failures per subject)", n, history.Keep, history.Keep))
	}
	return errors.Join(errs...)
}

// withDefaults fills what c leaves zero.
func (c Config) withDefaults() Config {
	if c.HistoryN == 0 {
		c.HistoryN = DefaultHistoryN
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
