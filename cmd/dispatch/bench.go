package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/spendbench"
)

const benchUsage = `usage: dispatch bench spend [-tasks 300] [-mode once|steady|both] [-runs 3] [-o json]
                            [-seed 1] [-context 1000] [-rate 10] [-latency 50ms] [-policy FILE]`

// cmdBench runs a benchmark in this process: an embedded NATS server and
// scripted endpoints of its own, nothing of DISPATCH_* is used.
func cmdBench(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "spend" {
		return errors.New(benchUsage)
	}
	return cmdBenchSpend(ctx, args[1:])
}

// cmdBenchSpend runs the spend benchmark (internal/spendbench): the
// workload through the mesh and through the naive loop, per delivery mode,
// runs times, and prints median (min–max) of every figure.
func cmdBenchSpend(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench spend", flag.ContinueOnError)
	tasks := fs.Int("tasks", 300, "tasks per run")
	mode := fs.String("mode", "both", "delivery: once (all at once), steady (at -rate) or both")
	runs := fs.Int("runs", 3, "runs per mode; run i uses the workload of seed -seed+i")
	seed := fs.Uint64("seed", 1, "workload seed of the first run")
	contextTokens := fs.Int("context", 1000, "filler context per prompt, in tokens (≈4 characters each)")
	rate := fs.Float64("rate", 10, "steady delivery rate, tasks per second")
	latency := fs.Duration("latency", 50*time.Millisecond, "delay of every answer of the scripted model (0: none)")
	policyFile := fs.String("policy", "", "policy file for the mesh and the loop's templates (default: built-in defaults)")
	output := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var modes []string
	switch *mode {
	case "both":
		modes = []string{spendbench.ModeOnce, spendbench.ModeSteady}
	case spendbench.ModeOnce, spendbench.ModeSteady:
		modes = []string{*mode}
	default:
		return fmt.Errorf("-mode %q: want once, steady or both", *mode)
	}
	if *tasks <= 0 || *runs <= 0 || *rate <= 0 || *contextTokens < 0 {
		return errors.New("-tasks, -runs and -rate must be positive, -context not negative")
	}
	cfg := spendbench.Config{
		Workload: spendbench.Workload{Tasks: *tasks, Seed: *seed, ContextTokens: *contextTokens},
		Rate:     *rate,
		Latency:  *latency,
	}
	if *contextTokens == 0 {
		cfg.Workload.ContextTokens = -1
	}
	if *latency == 0 {
		cfg.Latency = -1
	}
	if *policyFile != "" {
		data, err := os.ReadFile(*policyFile)
		if err != nil {
			return err
		}
		cfg.Policy = string(data)
	}
	n := 0
	progress := func(c spendbench.Comparison) {
		n++
		fmt.Fprintf(os.Stderr, "run %d/%d (%s, seed %d): mesh resolved %d, %d tokens, %.1fs | loop resolved %d, %d tokens, %.1fs\n",
			n, len(modes)**runs, c.Mode, c.Seed, c.Mesh.Resolved, c.Mesh.Tokens, c.Mesh.WallSeconds,
			c.Loop.Resolved, c.Loop.Tokens, c.Loop.WallSeconds)
	}
	sum, err := spendbench.Bench(ctx, cfg, modes, *runs, progress)
	if err != nil {
		return err
	}
	if *output == "json" {
		return sum.WriteJSON(stdout)
	}
	return sum.Report(stdout)
}
