package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// View is what the gate reads of a type's trust: its outcomes and its gate
// facts, in memory (*trust.View implements it). Sync waits until it holds
// every outcome of the type stored so far.
type View interface {
	Stats(taskType string) trust.Stats
	Sync(ctx context.Context, taskType string) error
	// Pool is the mesh's pooled evidence a type's is shrunk toward.
	Pool(p trust.Policy) *trust.Pool
	// Applied is closed when the next outcome of any type is applied.
	Applied() <-chan struct{}
}

// Config of the gate.
type Config struct {
	// View gives each type's outcomes and gate facts (required): scoring a
	// pass reads nothing from the server.
	View View
	// Trust keeps the gate facts (required): written, under compare-and-set,
	// only by a decision that changes them — a block, a probe, a canary
	// place taken or given up.
	Trust *trust.Store
	// Spending is what each type spent per day; required when a type has a
	// daily_budget.
	Spending *trust.Spending
	// Tasks, when set, gets the status of the tasks the gate stops.
	Tasks *services.TaskStore
	// Held, when set, is the held index: a pass held for trust sleeps
	// there, acked, until the sweeper wakes it, instead of being snoozed
	// in the held consumer, where it would hold a pending slot for as long
	// as it is held. JS is then required: the sweeper watches the index,
	// and wakes a pass by republishing its held event.
	Held *services.HeldIndex
	JS   jetstream.JetStream
	// SweepEvery is how often the sweeper looks over the held index.
	// Default 250ms: a sweep reads nothing from the server but the two
	// consumer infos of the MaxBacklog bound.
	SweepEvery time.Duration
	// Readmit bounds how many held passes of one type a sweep wakes for
	// re-admission once the type recovered, oldest first. Default 16.
	Readmit int
	// MaxBacklog bounds the executor's queue the sweeper feeds: it wakes
	// passes bound for the model in bulk — held passes re-admitted, passes
	// that waited for canaries once their type is scored or past the
	// canary TTL — only while fewer than MaxBacklog messages wait, not yet
	// delivered, at the prompt builder's and the executor's consumers
	// together (one consumer-info read of each per sweep). A flood of one
	// type then enters the executor's queue as fast as executors take it,
	// and a new type's canaries wait behind at most that many. Wakes for a
	// free canary place, a probe or a hand-off are not bounded. Default
	// 128; negative: no bound.
	MaxBacklog int
	// Policy supplies per-type exemption, threshold, canary and rung floor.
	Policy *policy.Source
	// Shadow, when set and holding a policy, is the shadow policy: each
	// decision is also computed under it, recorded and counted
	// (dispatch_shadow_decisions_total), never enforced.
	Shadow *policy.Source
	// Scoring defaults (window 50, minimum 10, threshold 0.15, probe after 5
	// blocks, 3 canaries, rung floor 0.25 after 8 samples); a type's policy
	// overrides them (policy.Type.Scoring).
	Scoring trust.Policy
	// Registry receives the gate's metrics (metrics.go). Default: none.
	Registry prometheus.Registerer
	// TypeLabels bounds the type label of the gate's metrics: the types
	// Policy names and the first services.DefaultMaxTypeLabels others get
	// their own, the rest "other". The services of one process share one
	// (mesh does). Default: a set of the gate's own.
	TypeLabels *services.LabelSet
	// Instance names this process in events.
	Instance string
	Log      *slog.Logger
	Now      func() time.Time
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.View == nil {
		errs = append(errs, errors.New("gate: View (the trust windows) is required"))
	}
	if c.Trust == nil {
		errs = append(errs, errors.New("gate: Trust store is required"))
	}
	if c.Held != nil && c.JS == nil {
		errs = append(errs, errors.New("gate: JS is required with the held index (the sweeper reads and publishes)"))
	}
	if err := c.Scoring.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("gate: Scoring: %w", err))
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
	if c.SweepEvery <= 0 {
		c.SweepEvery = 250 * time.Millisecond
	}
	if c.Readmit <= 0 {
		c.Readmit = 16
	}
	if c.MaxBacklog == 0 {
		c.MaxBacklog = DefaultMaxBacklog
	}
	return c
}

// DefaultMaxBacklog is Config.MaxBacklog's default.
const DefaultMaxBacklog = 128
