package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/bench/spendbench"
)

const benchUsage = `usage: dispatch bench spend [-workload default|steady|batch|longtail|regression] [-prompt short|long]
                            [-tasks N] [-mode once|steady|both] [-runs 3] [-o json]
                            [-seed 1] [-context 1000] [-rate 10] [-latency 50ms] [-policy FILE]`

// cmdBench runs a benchmark in this process: an embedded NATS server and
// scripted endpoints of its own, nothing of DISPATCH_* is used.
func cmdBench(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "spend" {
		return errors.New(benchUsage)
	}
	return cmdBenchSpend(ctx, args[1:])
}

// benchSpendRun is what `dispatch bench spend` runs, from its flags.
type benchSpendRun struct {
	cfg    spendbench.Config
	modes  []string
	runs   int
	output string
}

// parseBenchSpend reads the flags of `dispatch bench spend`. A flag left
// unset takes the workload's default: its size, its delivery modes.
func parseBenchSpend(args []string) (benchSpendRun, error) {
	fs := flag.NewFlagSet("bench spend", flag.ContinueOnError)
	workload := fs.String("workload", spendbench.ShapeDefault, "workload shape: "+strings.Join(spendbench.ShapeNames(), ", "))
	promptSize := fs.String("prompt", "", "prompt size: short (no filler context) or long (≈1,000 tokens); default: -context")
	tasks := fs.Int("tasks", 0, "tasks per run (default: the workload's, 300 for default; longtail and regression have a fixed size)")
	mode := fs.String("mode", "", "delivery: once (all at once), steady (at -rate) or both (default: the workload's)")
	runs := fs.Int("runs", 3, "runs per mode; run i uses the workload of seed -seed+i")
	seed := fs.Uint64("seed", 1, "workload seed of the first run")
	contextTokens := fs.Int("context", 1000, "filler context per prompt, in tokens (≈4 characters each)")
	rate := fs.Float64("rate", 10, "steady delivery rate, tasks per second")
	latency := fs.Duration("latency", 50*time.Millisecond, "delay of every answer of the scripted model (0: none)")
	policyFile := fs.String("policy", "", "policy file for the mesh and the loop's templates (default: built-in defaults)")
	output := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return benchSpendRun{}, err
	}
	if fs.NArg() > 0 {
		return benchSpendRun{}, fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), benchUsage)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	shape, ok := spendbench.LookupShape(*workload)
	if !ok {
		return benchSpendRun{}, fmt.Errorf("-workload %q: want one of %s", *workload, strings.Join(spendbench.ShapeNames(), ", "))
	}
	if set["tasks"] && shape.Fixed {
		return benchSpendRun{}, fmt.Errorf("-tasks: the %s workload has a fixed size (%s)", shape.Name, shape.Description)
	}
	modes := shape.Modes
	switch *mode {
	case "":
	case "both":
		modes = []string{spendbench.ModeOnce, spendbench.ModeSteady}
	case spendbench.ModeOnce, spendbench.ModeSteady:
		modes = []string{*mode}
	default:
		return benchSpendRun{}, fmt.Errorf("-mode %q: want once, steady or both", *mode)
	}
	if (set["tasks"] && *tasks <= 0) || *runs <= 0 || *rate <= 0 || *contextTokens < 0 {
		return benchSpendRun{}, errors.New("-tasks, -runs and -rate must be positive, -context not negative")
	}
	ctxTokens := *contextTokens
	if ctxTokens == 0 {
		ctxTokens = -1
	}
	if *promptSize != "" {
		if set["context"] {
			return benchSpendRun{}, errors.New("-prompt and -context both size the prompt: give one")
		}
		n, ok := spendbench.PromptContextTokens(*promptSize)
		if !ok {
			return benchSpendRun{}, fmt.Errorf("-prompt %q: want %s or %s", *promptSize, spendbench.PromptShort, spendbench.PromptLong)
		}
		ctxTokens = n
	}
	cfg := spendbench.Config{
		Workload: spendbench.Workload{Shape: shape.Name, Tasks: *tasks, Seed: *seed, ContextTokens: ctxTokens},
		Rate:     *rate,
		Latency:  *latency,
	}
	if *latency == 0 {
		cfg.Latency = -1
	}
	if *policyFile != "" {
		data, err := os.ReadFile(*policyFile)
		if err != nil {
			return benchSpendRun{}, err
		}
		cfg.Policy = string(data)
	}
	return benchSpendRun{cfg: cfg, modes: modes, runs: *runs, output: *output}, nil
}

// cmdBenchSpend runs the spend benchmark (internal/bench/spendbench): the
// workload through the mesh and through the naive loop, per delivery mode,
// runs times, and prints median (min–max) of every figure.
func cmdBenchSpend(ctx context.Context, args []string) error {
	r, err := parseBenchSpend(args)
	if err != nil {
		return err
	}
	n := 0
	progress := func(c spendbench.Comparison) {
		n++
		fmt.Fprintf(os.Stderr, "run %d/%d (%s, %s, seed %d): mesh resolved %d, %d tokens, %.1fs | loop resolved %d, %d tokens, %.1fs\n",
			n, len(r.modes)*r.runs, c.Workload, c.Mode, c.Seed, c.Mesh.Resolved, c.Mesh.Tokens, c.Mesh.WallSeconds,
			c.Loop.Resolved, c.Loop.Tokens, c.Loop.WallSeconds)
	}
	sum, err := spendbench.Bench(ctx, r.cfg, r.modes, r.runs, progress)
	if err != nil {
		return err
	}
	if r.output == "json" {
		return sum.WriteJSON(stdout)
	}
	return sum.Report(stdout)
}
