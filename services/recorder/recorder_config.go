package recorder

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"dispatchmesh/history"
	"dispatchmesh/internal/policy"
	"dispatchmesh/services"
	"dispatchmesh/trust"
)

// Config of the recorder.
type Config struct {
	Tasks   *services.TaskStore // required
	Trust   *trust.Store        // required
	History *history.Store      // required
	// Spending counts what each type spent per day (the gate's daily
	// budget). Default: not counted.
	Spending *trust.Spending
	// Policy supplies each type's max_retries (default 7) and pipeline.
	Policy *policy.Source
	// Scoring is used to report the trust score in escalation records.
	Scoring  trust.Policy
	Instance string
	Log      *slog.Logger
	Now      func() time.Time
	// Registry receives the spend metrics (see metrics.go). Default: nil,
	// no metrics are registered.
	Registry prometheus.Registerer
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.Tasks == nil {
		errs = append(errs, errors.New("recorder: Tasks store is required"))
	}
	if c.Trust == nil {
		errs = append(errs, errors.New("recorder: Trust store is required"))
	}
	if c.History == nil {
		errs = append(errs, errors.New("recorder: History store is required"))
	}
	if err := c.Scoring.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("recorder: Scoring: %w", err))
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
