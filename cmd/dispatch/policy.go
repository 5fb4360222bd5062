package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/natsperm"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/services"
)

const policyUsage = `usage:
  dispatch policy set [-rev N] FILE
                                  validate FILE, inline its template files and make it the policy of every service;
                                  with -rev, only if revision N is in force (0: only if the bucket holds no policy yet)
  dispatch policy get [-rev N]    print the policy in the bucket (the newest revision, or revision N) on stdout,
                                  its revision on stderr
  dispatch policy validate FILE   check FILE as set would, without connecting
  dispatch policy shadow FILE     store FILE beside the policy in force: every decision is also computed under it,
                                  recorded, never enforced (dispatch_shadow_decisions_total)
  dispatch policy shadow -clear   drop the shadow policy
  dispatch policy promote         make the shadow policy the one in force, as a new revision`

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
	case "shadow":
		return cmdPolicyShadow(ctx, cfg, args[1:])
	case "promote":
		return cmdPolicyPromote(ctx, cfg, args[1:])
	}
	return fmt.Errorf("unknown policy command %q\n%s", args[0], policyUsage)
}

// policyFileArg is the one FILE argument of set and validate, read and
// inlined as the bucket will hold it; fs (nil: none) holds the command's
// flags.
func policyFileArg(name string, args []string, fs *flag.FlagSet) (string, *policy.File, error) {
	if fs == nil {
		fs = flag.NewFlagSet("policy "+name, flag.ContinueOnError)
	}
	if err := fs.Parse(args); err != nil {
		return "", nil, err
	}
	if fs.NArg() != 1 {
		hint := ""
		if fs.NArg() > 1 && strings.HasPrefix(fs.Arg(1), "-") {
			hint = " (flags go before FILE)"
		}
		return "", nil, fmt.Errorf("dispatch policy %s FILE: one policy file is required%s\n%s", name, hint, policyUsage)
	}
	path := fs.Arg(0)
	f, err := policy.LoadInline(path)
	if err != nil {
		return path, nil, &exitError{1, fmt.Errorf("invalid policy, nothing changed: %w", err)}
	}
	return path, f, nil
}

func cmdPolicyValidate(args []string) error {
	path, f, err := policyFileArg("validate", args, nil)
	if err != nil {
		return err
	}
	if _, err := policy.Encode(f); err != nil {
		return &exitError{1, fmt.Errorf("invalid policy: %s: %w", path, err)}
	}
	fmt.Fprintf(stdout, "%s: valid (%s)\n", path, describePolicy(f))
	return nil
}

// revFlag is an optional revision: set tells whether -rev was given.
type revFlag struct {
	set bool
	n   uint64
}

func (r *revFlag) String() string {
	if r == nil || !r.set {
		return ""
	}
	return strconv.FormatUint(r.n, 10)
}

func (r *revFlag) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return errors.New("a revision is a number, 0 or more")
	}
	r.set, r.n = true, n
	return nil
}

func cmdPolicySet(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("policy set", flag.ContinueOnError)
	var expect revFlag
	fs.Var(&expect, "rev", "set only if this revision is in force (`N`: as dispatch policy get printed it; 0: only if the bucket holds no policy yet)")
	path, f, err := policyFileArg("set", args, fs)
	if err != nil {
		return err
	}
	kv, nc, closeFn, err := policyBucket(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	var replaced, rev uint64
	if expect.set {
		replaced = expect.n
		rev, err = policykv.PutAt(ctx, kv, f, expect.n)
	} else {
		replaced, rev, err = policykv.Replace(ctx, kv, f)
	}
	if conflict, ok := errors.AsType[*policykv.ConflictError](err); ok {
		return &exitError{1, fmt.Errorf("%s: nothing changed: %s (it changed since you read it): run dispatch policy get to see the policy in force, then retry with -rev %d",
			path, describeConflict(conflict), conflict.Current)}
	}
	if err != nil {
		// A user that may not write the bucket (only admin may) times
		// out: say which permission is missing.
		return fmt.Errorf("%s: %w", path, natsperm.Explain(nc, err))
	}
	was := replacedText(ctx, kv, replaced)
	fmt.Fprintf(stdout, "policy revision %d in force (%s from %s; %s); every service applies it now\n", rev, describePolicy(f), path, was)
	return nil
}

// replacedText says what a set replaced: the revision in force when
// revision replaced was the newest in the bucket. They differ when newer
// puts did not decode (nats kv put behind set's back): every service
// refused them and kept the one before.
func replacedText(ctx context.Context, kv jetstream.KeyValue, replaced uint64) string {
	if replaced == 0 {
		return "the bucket held no policy"
	}
	st, err := policykv.InForce(ctx, kv, replaced)
	if err != nil {
		return fmt.Sprintf("replacing revision %d, the newest in the bucket (which revision was in force could not be read: %v)", replaced, err)
	}
	if st.Rev == replaced {
		return fmt.Sprintf("replacing revision %d", replaced)
	}
	refused := make([]string, len(st.Refused))
	for i, r := range st.Refused {
		refused[i] = strconv.FormatUint(r, 10)
	}
	why := fmt.Sprintf("revision %s, newer in the bucket, did not decode and every service refused it", strings.Join(refused, ", "))
	if len(refused) > 1 {
		why = fmt.Sprintf("revisions %s, newer in the bucket, did not decode and every service refused them", strings.Join(refused, ", "))
	}
	switch {
	case st.Rev == 0:
		return "replacing the built-in defaults, in force because no revision in the bucket decodes (" + why + ")"
	case st.Deleted:
		return fmt.Sprintf("replacing the built-in defaults, in force since revision %d deleted the policy (%s)", st.Rev, why)
	}
	return fmt.Sprintf("replacing revision %d, the one in force (%s)", st.Rev, why)
}

// describeConflict says which revision -rev expected and which is in force.
func describeConflict(c *policykv.ConflictError) string {
	switch {
	case c.Expected == 0:
		return fmt.Sprintf("-rev 0 expects no policy in bucket %s, but revision %d is in force", services.BucketPolicy, c.Current)
	case c.Current == 0:
		return fmt.Sprintf("-rev %d expects revision %d in force, but bucket %s holds no policy", c.Expected, c.Expected, services.BucketPolicy)
	}
	return fmt.Sprintf("-rev %d expects revision %d in force, but the current revision is %d", c.Expected, c.Expected, c.Current)
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
// until ctx ends. On a one-shot command's connection (clientJS: dispatch
// review, audit, …) which policy is in force is logged at debug level —
// the command's output is not a log; the review page of dispatch web and
// dispatch up, which runs for long on its own connection, logs it as the
// services do.
func watchPolicy(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*policy.Source, error) {
	kv, err := js.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", services.BucketPolicy, err)
	}
	return policykv.WatchWith(ctx, kv, policykv.WatchOptions{JS: js, Log: log, Quiet: oneShot(js.Conn())})
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
	rev, seeded, err := policykv.Seed(ctx, kv, f)
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
