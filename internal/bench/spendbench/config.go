package spendbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// Delivery modes.
const (
	// ModeOnce submits every task at once.
	ModeOnce = "once"
	// ModeSteady submits tasks at Config.Rate per second.
	ModeSteady = "steady"
)

// Runners.
const (
	RunnerMesh = "mesh"
	RunnerLoop = "loop"
)

// DefaultPolicy is the policy file the mesh runs with: the built-in
// defaults, nothing tuned per type.
const DefaultPolicy = `{"defaults": {}}`

// Config configures one run.
type Config struct {
	// Workload generates the tasks.
	Workload Workload
	// Mode is ModeOnce (default) or ModeSteady.
	Mode string
	// Rate is the steady mode's submissions per second. Default 10.
	Rate float64
	// Latency delays every answer of the scripted server. Default 50ms;
	// negative means none.
	Latency time.Duration
	// Model is the model name the tasks ask for. Default gpt-4o-mini.
	Model string
	// Policy is the policy file (JSON) of the mesh and of the loop's
	// templates. Default DefaultPolicy.
	Policy string
	// LoopTries, LoopGap and LoopConcurrency shape the naive loop: tries
	// per task (default 3), the pause between two tries (default 100ms),
	// tasks in flight at once (default 16, the executor's concurrency).
	LoopTries       int
	LoopGap         time.Duration
	LoopConcurrency int
	// Wait bounds how long the mesh run waits for every task to end; the
	// tasks still open then are reported as not ended. Default 15m.
	Wait time.Duration
	// Log receives the mesh's logs. Default: discarded.
	Log *slog.Logger
	// Inspect, when set, is called with the mesh's JetStream once every
	// task ended (or Wait passed), before the mesh stops: a test reads the
	// stream the run recorded (dispatch whatif replays it).
	Inspect func(ctx context.Context, js jetstream.JetStream) error
	// Shadow, when set, is a shadow policy file (JSON) the mesh computes
	// every decision under too, never enforced (dispatch policy shadow).
	Shadow string
	// Registry, when set, receives the mesh's metrics.
	Registry prometheus.Registerer
}

func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeOnce
	}
	if c.Rate <= 0 {
		c.Rate = 10
	}
	switch {
	case c.Latency == 0:
		c.Latency = 50 * time.Millisecond
	case c.Latency < 0:
		c.Latency = 0
	}
	if c.Model == "" {
		c.Model = "gpt-4o-mini"
	}
	if c.Policy == "" {
		c.Policy = DefaultPolicy
	}
	if c.LoopTries <= 0 {
		c.LoopTries = 3
	}
	if c.LoopGap <= 0 {
		c.LoopGap = 100 * time.Millisecond
	}
	if c.LoopConcurrency <= 0 {
		c.LoopConcurrency = 16
	}
	if c.Wait <= 0 {
		c.Wait = 15 * time.Minute
	}
	if c.Log == nil {
		var w io.Writer = io.Discard
		if path := os.Getenv("DISPATCH_BENCH_LOG"); path != "" { // the mesh's log, to read a run
			if f, err := os.Create(path); err == nil {
				w = f
			}
		}
		c.Log = slog.New(slog.NewTextHandler(w, nil))
	}
	c.Workload = c.Workload.withDefaults()
	return c
}

func (c Config) policy() (*policy.Source, error) {
	f, err := policy.Parse([]byte(c.Policy))
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return policy.Static(f), nil
}

// shadow is the shadow policy (nil: none).
func (c Config) shadow() (*policy.Source, error) {
	if c.Shadow == "" {
		return nil, nil
	}
	f, err := policy.Parse([]byte(c.Shadow))
	if err != nil {
		return nil, fmt.Errorf("shadow policy: %w", err)
	}
	return policy.Static(f), nil
}

// Run generates cfg's workload and runs it through the mesh, then through
// the naive loop, each against its own scripted server.
func Run(ctx context.Context, cfg Config) (Comparison, error) {
	cfg = cfg.withDefaults()
	if cfg.Mode != ModeOnce && cfg.Mode != ModeSteady {
		return Comparison{}, fmt.Errorf("mode %q: want %s or %s", cfg.Mode, ModeOnce, ModeSteady)
	}
	if _, ok := LookupShape(cfg.Workload.Shape); !ok {
		return Comparison{}, fmt.Errorf("workload %q: want %s", cfg.Workload.Shape, strings.Join(ShapeNames(), ", "))
	}
	tasks := Generate(cfg.Workload)
	m, err := RunMesh(ctx, cfg, tasks)
	if err != nil {
		return Comparison{}, fmt.Errorf("mesh run: %w", err)
	}
	l, err := RunLoop(ctx, cfg, tasks)
	if err != nil {
		return Comparison{}, fmt.Errorf("loop run: %w", err)
	}
	return compare(cfg, tasks, m, l), nil
}

// Bench runs each mode runs times — run i on the workload of seed
// cfg.Workload.Seed+i, the same for every mode — calling progress (when
// not nil) after each, and summarizes them.
func Bench(ctx context.Context, cfg Config, modes []string, runs int, progress func(Comparison)) (Summary, error) {
	cfg = cfg.withDefaults()
	var all []Comparison
	for i := range max(runs, 1) {
		for _, mode := range modes {
			c := cfg
			c.Mode = mode
			c.Workload.Seed = cfg.Workload.Seed + uint64(i)
			r, err := Run(ctx, c)
			if err != nil {
				return Summary{}, fmt.Errorf("%s run %d: %w", mode, i+1, err)
			}
			if progress != nil {
				progress(r)
			}
			all = append(all, r)
		}
	}
	return Summarize(cfg, all), nil
}
