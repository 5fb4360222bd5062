package verifier

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Config configures a Service. The zero value works: types without a
// verifier are skipped, and http and command verifiers need nothing more.
type Config struct {
	// NC is the connection nats verifiers are asked on. Default nil: a type
	// with a nats verifier then gets a verifier error (ErrNoConn).
	NC *nats.Conn
	// CommandEnv names the environment variables a command verifier gets
	// besides procgroup.DefaultEnv (DISPATCH_COMMAND_ENV); nothing else of
	// the verifier's.
	CommandEnv []string
	// CommandLimits bound each process of a command verifier: CPU time,
	// memory, open files (DISPATCH_COMMAND_CPU, _MEMORY, _FILES). Default:
	// none (the dispatch binary sets procgroup.DefaultLimits).
	CommandLimits procgroup.Limits
	// HTTPClient sends http verifiers' requests. Default http.DefaultClient;
	// each check is bounded by its verifier's timeout either way.
	HTTPClient *http.Client
	// Policy gives each type's verifier. Default nil: built-in defaults (none).
	Policy *policy.Source
	// Tasks, when set, gets status verifying before a check and cancelled
	// for a cancelled task. Default nil: task state is left alone.
	Tasks *services.TaskStore
	// Registry receives the task metrics (a task the verifier cancels is
	// counted as dispatch_tasks_finished_total{status="cancelled",
	// by="verifier"}). Default: none.
	Registry prometheus.Registerer
	// TypeLabels bounds the type label of the verifier's metrics: the types
	// Policy names and the first services.DefaultMaxTypeLabels others get
	// their own, the rest "other". The services of one process share one
	// (mesh does). Default: a set of the verifier's own.
	TypeLabels *services.LabelSet
	// Instance names this instance in the events' by field.
	// Default "verifier@<hostname>:<pid>".
	Instance string
	// Log receives the service's logs. Default slog.Default().
	Log *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Validate reports every problem of the configuration at once: a current
// policy that is invalid, or that names a nats verifier while NC is nil;
// negative CommandLimits.
func (c Config) Validate() error {
	var errs []error
	if err := c.CommandLimits.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("CommandLimits: %w", err))
	}
	if f := c.Policy.File(); f != nil {
		errs = append(errs, f.Validate())
		check := func(where string, t policy.Type) {
			if t.Verifier != nil && t.Verifier.Kind == policy.VerifierNATS && c.NC == nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, ErrNoConn))
			}
		}
		check("defaults", f.Defaults)
		for name, t := range f.Types {
			check("types."+name, t)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("verifier: %w", err)
	}
	return nil
}

// withDefaults fills what c leaves zero.
func (c Config) withDefaults() Config {
	if c.TypeLabels == nil {
		c.TypeLabels = services.NewLabelSet(services.DefaultMaxTypeLabels, c.Policy.Names)
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = fmt.Sprintf("verifier@%s:%d", host, os.Getpid())
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
