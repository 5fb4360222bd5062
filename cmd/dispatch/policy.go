package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/internal/natsperm"
	"dispatchmesh/internal/policy"
	"dispatchmesh/services"
)

const policyUsage = `usage:
  dispatch policy set FILE        validate FILE, inline its template files and make it the policy of every service
  dispatch policy get [-rev N]    print the policy in the bucket (the newest revision, or revision N)
  dispatch policy validate FILE   check FILE as set would, without connecting`

// cmdPolicy reads and changes the policy in the bucket dispatch_policy.
func cmdPolicy(ctx context.Context, cfg Config, args []string) error {
	if len(args) == 0 {
		return errors.New(policyUsage)
	}
	switch args[0] {
	case "set":
		return cmdPolicySet(ctx, cfg, args[1:])
	case "get":
		return cmdPolicyGet(ctx, cfg, args[1:])
	case "validate":
		return cmdPolicyValidate(args[1:])
	}
	return fmt.Errorf("unknown policy command %q\n%s", args[0], policyUsage)
}

// policyFileArg is the one FILE argument of set and validate, read and
// inlined as the bucket will hold it.
func policyFileArg(name string, args []string) (string, *policy.File, error) {
	fs := flag.NewFlagSet("policy "+name, flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return "", nil, err
	}
	if fs.NArg() != 1 {
		return "", nil, fmt.Errorf("dispatch policy %s FILE: one policy file is required\n%s", name, policyUsage)
	}
	path := fs.Arg(0)
	f, err := policy.LoadInline(path)
	if err != nil {
		return path, nil, &exitError{1, fmt.Errorf("invalid policy, nothing changed: %w", err)}
	}
	return path, f, nil
}

func cmdPolicyValidate(args []string) error {
	path, f, err := policyFileArg("validate", args)
	if err != nil {
		return err
	}
	if _, err := policy.Encode(f); err != nil {
		return &exitError{1, fmt.Errorf("invalid policy: %s: %w", path, err)}
	}
	fmt.Fprintf(stdout, "%s: valid (%s)\n", path, describePolicy(f))
	return nil
}

func cmdPolicySet(ctx context.Context, cfg Config, args []string) error {
	path, f, err := policyFileArg("set", args)
	if err != nil {
		return err
	}
	kv, nc, closeFn, err := policyBucket(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	rev, err := policy.Put(ctx, kv, f)
	if err != nil {
		// A user that may not write the bucket (only admin may) times
		// out: say which permission is missing.
		return fmt.Errorf("%s: %w", path, natsperm.Explain(nc, err))
	}
	fmt.Fprintf(stdout, "policy revision %d in force (%s from %s); every service applies it now\n", rev, describePolicy(f), path)
	return nil
}

func cmdPolicyGet(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("policy get", flag.ContinueOnError)
	rev := fs.Uint64("rev", 0, "the revision to print (default: the newest)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	kv, _, closeFn, err := policyBucket(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	var e jetstream.KeyValueEntry
	if *rev == 0 {
		e, err = kv.Get(ctx, policy.Key)
	} else {
		e, err = kv.GetRevision(ctx, policy.Key, *rev)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) && *rev == 0:
		return &exitError{1, fmt.Errorf("bucket %s holds no policy: the services run the built-in defaults (set one with dispatch policy set FILE)", services.BucketPolicy)}
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return &exitError{1, fmt.Errorf("bucket %s holds no revision %d of the policy (a delete, purged, or never written)", services.BucketPolicy, *rev)}
	case err != nil:
		return err
	}
	data := e.Value()
	if !bytes.HasSuffix(data, []byte("\n")) {
		data = append(data, '\n')
	}
	if _, err := stdout.Write(data); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "policy revision %d, written %s\n", e.Revision(), e.Created().UTC().Format("2006-01-02T15:04:05Z"))
	if _, err := policy.Decode(e.Value()); err != nil {
		// Put behind dispatch policy set's back (nats kv put): the
		// services refused it and kept the revision before.
		return &exitError{1, fmt.Errorf("revision %d does not decode, so no service runs it (each kept the policy it had): %w", e.Revision(), err)}
	}
	return nil
}

// describePolicy says what a policy holds, in a few words.
func describePolicy(f *policy.File) string {
	var names []string
	for name := range f.Types {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "defaults only"
	}
	return fmt.Sprintf("%d types: %s", len(names), strings.Join(names, ", "))
}

// policyBucket binds the policy bucket as the configured NATS user.
func policyBucket(ctx context.Context, cfg Config) (jetstream.KeyValue, *nats.Conn, func(), error) {
	js, closeFn, err := clientJS(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	kv, err := js.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		err = natsperm.Explain(js.Conn(), err)
		closeFn()
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			err = fmt.Errorf("%w: %s (is the mesh provisioned? dispatch up, or dispatch provision as the admin user)", err, services.BucketPolicy)
		}
		return nil, nil, nil, err
	}
	return kv, js.Conn(), closeFn, nil
}

// watchPolicy serves the policy in the bucket on js, following its changes
// until ctx ends.
func watchPolicy(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*policy.Source, error) {
	kv, err := js.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", services.BucketPolicy, err)
	}
	return policy.Watch(ctx, kv, log)
}

// seedPolicy stores DISPATCH_POLICY_FILE (else the built-in defaults, {})
// in the policy bucket when it holds no policy yet, and says which
// revision is in force. A policy already in the bucket stays: it may hold
// changes made with dispatch policy set, which a restart must not undo; a
// file that differs from it is reported, not applied.
func seedPolicy(ctx context.Context, cfg Config, kv jetstream.KeyValue, log *slog.Logger) (string, error) {
	var f *policy.File
	if cfg.PolicyFile != "" {
		var err error
		if f, err = policy.LoadInline(cfg.PolicyFile); err != nil {
			return "", fmt.Errorf("DISPATCH_POLICY_FILE: %w", err)
		}
	}
	rev, seeded, err := policy.Seed(ctx, kv, f)
	if err != nil {
		return "", err
	}
	from := "the built-in defaults"
	if cfg.PolicyFile != "" {
		from = cfg.PolicyFile
	}
	if seeded {
		log.Info("policy seeded", "bucket", services.BucketPolicy, "rev", rev, "from", from)
		return fmt.Sprintf("bucket %s, revision %d (seeded from %s)", services.BucketPolicy, rev, from), nil
	}
	line := fmt.Sprintf("bucket %s, revision %d (already there)", services.BucketPolicy, rev)
	if f == nil {
		return line, nil
	}
	want, err := policy.Encode(f)
	if err != nil {
		return "", err
	}
	if e, err := kv.Get(ctx, policy.Key); err == nil && !bytes.Equal(e.Value(), want) {
		log.Warn("DISPATCH_POLICY_FILE differs from the policy in the bucket, which stays in force; apply the file with dispatch policy set",
			"file", cfg.PolicyFile, "bucket", services.BucketPolicy, "rev", rev)
		line += fmt.Sprintf("; %s differs and was NOT applied: dispatch policy set %s", cfg.PolicyFile, cfg.PolicyFile)
	}
	return line, nil
}
