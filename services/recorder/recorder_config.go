package recorder

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Trust is what the recorder reads of a type's trust: its window, for the
// score an escalation record reports. *trust.View implements it.
type Trust interface {
	Stats(taskType string) trust.Stats
}

// Config of the recorder.
type Config struct {
	Tasks *services.TaskStore // required
	// History keeps each (type, subject)'s last outcomes and failures
	// (required).
	History *history.Store
	// Trust gives each type's outcomes (required): the recorder publishes
	// an outcome, it never rewrites a window.
	Trust Trust
	// CountSpend publishes, with each outcome, the increments of its type's
	// spend counters for the day (trust.SpendMsgs: the gate's daily
	// budget). Default false: not counted.
	CountSpend bool
	// Policy supplies each type's max_retries (default 7) and pipeline.
	Policy *policy.Source
	// Shadow, when set and holding a policy, is the shadow policy: each
	// decision is also computed under it, recorded and counted
	// (dispatch_shadow_decisions_total), never enforced.
	Shadow *policy.Source
	// Scoring is used to report the trust score in escalation records.
	Scoring  trust.Policy
	Instance string
	Log      *slog.Logger
	Now      func() time.Time
	// Registry receives the spend metrics (see metrics.go). Default: nil,
	// no metrics are registered.
	Registry prometheus.Registerer
	// TypeLabels bounds the type label of the recorder's metrics: the types
	// Policy names and the first services.DefaultMaxTypeLabels others get
	// their own, the rest "other". The services of one process share one
	// (mesh does). Default: a set of the recorder's own.
	TypeLabels *services.LabelSet
	// NATS, when set, is where the recorder hears the human review actions
	// (dispatch.review.action.*, queue group "recorder": one instance
	// counts each) to count the tasks they end. Default nil: not counted.
	NATS *nats.Conn
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.Tasks == nil {
		errs = append(errs, errors.New("recorder: Tasks store is required"))
	}
	if c.History == nil {
		errs = append(errs, errors.New("recorder: History store is required"))
	}
	if c.Trust == nil {
		errs = append(errs, errors.New("recorder: Trust (the outcome windows) is required"))
	}
	if err := c.Scoring.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("recorder: Scoring: %w", err))
	}
	return errors.Join(errs...)
}

// withDefaults fills what c leaves zero.
func (c Config) withDefaults() Config {
	if c.TypeLabels == nil {
		c.TypeLabels = services.NewLabelSet(services.DefaultMaxTypeLabels, c.Policy.Names)
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
