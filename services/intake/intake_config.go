package intake

import (
	"errors"
	"log/slog"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/policy"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Config of the intake service.
type Config struct {
	// Tasks is the task state store (required).
	Tasks *services.TaskStore
	// Policy gives a pipeline type its first step.
	Policy *policy.Source
	// Instance names this process in events (service@host:pid).
	Instance string
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Now is the clock events are dated by. Default time.Now.
	Now func() time.Time
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.Tasks == nil {
		errs = append(errs, errors.New("intake: Tasks store is required"))
	}
	return errors.Join(errs...)
}

// withDefaults fills what c leaves zero.
func (c Config) withDefaults() Config {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
