package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/natsperm"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// cmdPolicyShadow stores a candidate policy beside the one in force (key
// shadow of the bucket): every gate and recorder decision is also computed
// under it and recorded, never enforced. -clear drops it.
func cmdPolicyShadow(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("policy shadow", flag.ContinueOnError)
	clear := fs.Bool("clear", false, "drop the shadow policy")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *clear {
		if fs.NArg() != 0 {
			return fmt.Errorf("dispatch policy shadow -clear takes no file\n%s", policyUsage)
		}
		kv, nc, closeFn, err := policyBucket(ctx, cfg)
		if err != nil {
			return err
		}
		defer closeFn()
		if err := policykv.ClearShadow(ctx, kv); err != nil {
			return natsperm.Explain(nc, err)
		}
		fmt.Fprintln(stdout, "shadow policy dropped; decisions are computed under the policy in force only")
		return nil
	}
	path, f, err := policyFileArg("shadow", args, fs)
	if err != nil {
		return err
	}
	kv, nc, closeFn, err := policyBucket(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	rev, err := policykv.PutShadow(ctx, kv, f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, natsperm.Explain(nc, err))
	}
	fmt.Fprintf(stdout, "shadow policy revision %d (%s from %s): every gate and recorder decision is also computed under it, never enforced (dispatch_shadow_decisions_total); dispatch policy promote makes it live\n",
		rev, describePolicy(f), path)
	return nil
}

// cmdPolicyPromote makes the shadow policy the policy in force, as a new
// revision, and drops the shadow.
func cmdPolicyPromote(ctx context.Context, cfg Config, args []string) error {
	if len(args) != 0 {
		return fmt.Errorf("dispatch policy promote takes no arguments\n%s", policyUsage)
	}
	kv, nc, closeFn, err := policyBucket(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	rev, err := policykv.Promote(ctx, kv)
	if errors.Is(err, policykv.ErrNoShadow) {
		return &exitError{1, fmt.Errorf("nothing promoted: %w (dispatch policy shadow FILE stores one)", err)}
	}
	if conflict, ok := errors.AsType[*policykv.ConflictError](err); ok {
		return &exitError{1, fmt.Errorf("nothing promoted: %s: retry", describeConflict(conflict))}
	}
	if err != nil {
		return natsperm.Explain(nc, err)
	}
	fmt.Fprintf(stdout, "policy revision %d in force (the shadow policy, promoted); the shadow is dropped\n", rev)
	return nil
}

// watchShadow follows the shadow policy in the policy bucket.
func watchShadow(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*policy.Source, error) {
	kv, err := js.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", services.BucketPolicy, err)
	}
	return policykv.WatchWith(ctx, kv, policykv.WatchOptions{JS: js, Log: log, Quiet: true, Key: policy.ShadowKey})
}
