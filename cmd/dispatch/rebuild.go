package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// cmdRebuild recomputes the task states, each type's trust (its outcomes
// on the outcome stream, the gate's facts), each subject's history (the
// history bucket), the spend counters and the gate's held index (the held
// bucket) from the event stream and reports where the live stores differ;
// -apply overwrites them.
// Each event is recomputed with the policy revision it names, read from
// the policy bucket's history; when the bucket does not hold one, rebuild
// says so and stops, unless -policy FILE says what to use instead.
func cmdRebuild(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("rebuild", flag.ContinueOnError)
	apply := fs.Bool("apply", false, "overwrite the live stores with the rebuilt ones")
	output := outputFlag(fs)
	fallback := fs.String("policy", "", "a policy file to recompute the events whose policy revision the bucket does not hold (default: refuse)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	js, closeFn, err := clientJS(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	opts := rebuild.Options{}
	if *fallback != "" {
		if opts.Fallback, err = policy.LoadInline(*fallback); err != nil {
			return err
		}
	}
	kv, err := js.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", services.BucketPolicy, err)
	}
	if opts.Revisions, err = policykv.History(ctx, kv); err != nil {
		return err
	}
	rebuilt, err := rebuild.Replay(ctx, js, opts)
	if errors.Is(err, rebuild.ErrPolicyUnavailable) {
		return &exitError{1, err}
	}
	if err != nil {
		return err
	}
	live, err := liveStores(ctx, js)
	if err != nil {
		return err
	}
	diffs, err := rebuild.Compare(ctx, live, rebuilt)
	if err != nil {
		return err
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		skipped := rebuilt.Skipped
		if skipped == nil {
			skipped = []rebuild.Skipped{}
		}
		fallbacks := rebuilt.Fallbacks
		if fallbacks == nil {
			fallbacks = []rebuild.Unavailable{}
		}
		if err := enc.Encode(map[string]any{
			"events": rebuilt.Events, "tasks": len(rebuilt.Tasks), "types": len(rebuilt.Trust),
			"histories": len(rebuilt.History), "held": len(rebuilt.Held), "differences": diffs, "skipped": skipped, "policy_fallbacks": fallbacks,
		}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "replayed %d events: %d tasks, %d task types, %d histories, %d held passes\n",
			rebuilt.Events, len(rebuilt.Tasks), len(rebuilt.Trust), len(rebuilt.History), len(rebuilt.Held))
		for _, u := range rebuilt.Fallbacks {
			fmt.Fprintf(stdout, "  recomputed with %s: %s\n", *fallback, u)
		}
		for _, sk := range rebuilt.Skipped {
			fmt.Fprintln(stdout, "  skipped (undecodable):", sk)
		}
		for _, d := range diffs {
			fmt.Fprintln(stdout, "  differs:", d)
		}
		if len(diffs) == 0 && len(rebuilt.Skipped) == 0 {
			fmt.Fprintln(stdout, "the live stores agree with the stream")
		}
	}
	// An undecodable event is a difference too: the stream holds something
	// no store reflects (its service dead-lettered it: see dispatch review).
	var found []error
	if n := len(rebuilt.Skipped); n > 0 {
		found = append(found, fmt.Errorf("%d events could not be decoded and were skipped", n))
	}
	if *apply {
		if err := rebuild.Apply(ctx, live, rebuilt); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "live stores overwritten with the rebuilt ones")
	} else if len(diffs) > 0 {
		found = append(found, fmt.Errorf("%d differences (run with -apply to restore the stores from the stream)", len(diffs)))
	}
	if len(found) > 0 {
		return &exitError{1, errors.Join(found...)}
	}
	return nil
}

func liveStores(ctx context.Context, js jetstream.JetStream) (rebuild.Live, error) {
	st, err := services.OpenStores(ctx, js)
	if err != nil {
		return rebuild.Live{}, err
	}
	return rebuild.Live{Tasks: st.Tasks, Trust: st.Trust, History: st.History, Held: st.Held, JS: js,
		Spending: trust.NewSpending(js, services.CounterStream)}, nil
}
