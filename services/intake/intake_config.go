package intake

import (
	"errors"
	"github.com/nats-io/nats.go/jetstream"
	"log/slog"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Config of the intake service.
type Config struct {
	// Tasks is the task state store (required).
	Tasks *services.TaskStore
	// JS, when set, reads the submissions' stream: a re-submission of an
	// id with another body is then kept as a rejection saying what
	// differs. Without it every re-submission of an id is ignored.
	JS jetstream.JetStream
	// Policy gives a pipeline type its first step, and names the types
	// KnownTypesOnly accepts.
	Policy *policy.Source
	// KnownTypesOnly rejects a submission whose type Policy does not name
	// (policy.File.Names), as invalid input: kept on
	// dispatch.review.rejected with the error, never run. Default false:
	// any well-formed type, which takes the policy's defaults
	// (DISPATCH_KNOWN_TYPES_ONLY; on in deploy/).
	KnownTypesOnly bool
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
