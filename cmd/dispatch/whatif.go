package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	core "github.com/dispatchmesh/dispatchmesh/internal/core/whatif"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/whatif"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// cmdWhatIf re-decides the recorded history under a candidate policy and
// reports actual against what-if (docs/whatif.md).
func cmdWhatIf(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("whatif", flag.ContinueOnError)
	file := fs.String("policy", "", "the candidate policy file (or -shadow)")
	useShadow := fs.Bool("shadow", false, "the candidate is the shadow policy in the bucket (dispatch policy shadow)")
	since := fs.Duration("since", 24*time.Hour, "report the tasks that started within this long")
	typ := fs.String("type", "", "report this task type only")
	output := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if (*file == "") == !*useShadow || fs.NArg() != 0 {
		return errors.New("usage: dispatch whatif -policy FILE | -shadow [-since 24h] [-type T] [-o json]")
	}
	js, closeFn, err := clientJS(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	f, rev, err := candidate(ctx, js, *file)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	// The last look at the passes the candidate holds is now: held past
	// their hold time, they have gone to a human.
	res, err := whatif.Run(ctx, js, core.Options{Policy: f, Revision: rev, Since: now.Add(-*since), Type: *typ, End: now})
	if err != nil {
		return err
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	printWhatIf(stdout, res)
	return nil
}

// candidate is the policy file path, or ("") the shadow policy in the
// bucket and its revision.
func candidate(ctx context.Context, js jetstream.JetStream, path string) (*policy.File, uint64, error) {
	if path != "" {
		f, err := policy.LoadInline(path)
		return f, 0, err
	}
	kv, err := js.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		return nil, 0, fmt.Errorf("bucket %s: %w", services.BucketPolicy, err)
	}
	f, rev, err := policykv.Shadow(ctx, kv)
	if err == nil && f == nil {
		err = &exitError{1, errors.New("no shadow policy in the bucket (dispatch policy shadow FILE stores one)")}
	}
	return f, rev, err
}

func printWhatIf(w io.Writer, res whatif.Result) {
	r := res.Report
	fmt.Fprintf(w, "%d tasks since %s\n\n", r.Tasks, r.Since.Format(time.RFC3339))
	fmt.Fprintf(w, "%-20s %10s %10s %9s %9s %6s %9s\n", "", "tokens", "cost", "resolved", "to_human", "held", "attempts")
	types := make([]string, 0, len(r.ByType))
	for t := range r.ByType {
		types = append(types, t)
	}
	sort.Strings(types)
	line := func(name string, a core.Figures, wi core.WhatIf) {
		fmt.Fprintf(w, "%-20s %10d %10.4f %9d %9d %6d %9d\n", name+" actual", a.Tokens, a.Cost, a.Resolved, a.ToHuman, a.Held, a.Attempts)
		fmt.Fprintf(w, "%-20s %10d %10.4f %9d %9d %6d %9d\n", "  what-if (facts)", wi.Tokens, wi.Cost, wi.Resolved, wi.ToHuman, wi.Held, wi.Attempts)
		if e := wi.Estimated; e.Tasks > 0 {
			fmt.Fprintf(w, "%-20s %10.0f %10.4f %9.1f %9.1f %6s %9.1f  (%d tasks)\n", "  + estimated", e.Tokens, e.Cost, e.Resolved, e.ToHuman, "", e.Attempts, e.Tasks)
		}
	}
	for _, t := range types {
		line(t, r.ByType[t].Actual, r.ByType[t].WhatIf)
	}
	line("total", r.Actual, r.WhatIf)
	fmt.Fprintf(w, "\n%d tasks change:\n", len(r.Changed))
	for _, c := range r.Changed {
		fmt.Fprintf(w, "  %s (%s): %s by %s/%s after %d attempts -> %s by %s/%s after %d attempts\n      %s\n",
			c.ID, c.Type, c.Actual.Fate, c.Actual.Decision, c.Actual.Cause, c.Actual.Attempts,
			c.WhatIf.Fate, c.WhatIf.Decision, c.WhatIf.Cause, c.WhatIf.Attempts, c.Cause)
	}
	if len(res.Skipped) > 0 {
		fmt.Fprintf(w, "\n%d events could not be decoded and were left out\n", len(res.Skipped))
	}
}
