package policykv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
)

// ErrNoRevision is returned by At when the bucket does not hold the revision
// asked for (0: none was recorded; else it was purged or never existed).
var ErrNoRevision = errors.New("policy revision not available")

// Put stores f as the new policy and returns its revision. A policy that
// does not validate is refused before anything is written.
func Put(ctx context.Context, kv jetstream.KeyValue, f *policy.File) (uint64, error) {
	data, err := policy.Encode(f)
	if err != nil {
		return 0, err
	}
	rev, err := kv.Put(ctx, policy.Key, data)
	if err != nil {
		return 0, fmt.Errorf("policy: put %s %s: %w", kv.Bucket(), policy.Key, err)
	}
	return rev, nil
}

// ErrRevisionConflict is returned (as a *ConflictError) by PutAt when the
// bucket's policy is not at the revision the caller expected.
var ErrRevisionConflict = errors.New("policy: another revision is in force")

// ConflictError says which revision was expected and which is in force.
type ConflictError struct {
	// Expected is the revision the caller expected (0: no policy yet).
	Expected uint64
	// Current is the revision in the bucket (0: none, or a delete).
	Current uint64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("policy: expected revision %d, the bucket holds revision %d", e.Expected, e.Current)
}

// Is makes errors.Is(err, ErrRevisionConflict) hold.
func (e *ConflictError) Is(target error) bool { return target == ErrRevisionConflict }

// Current is the revision of the policy in the bucket; 0 when it holds
// none (never written, or deleted).
func Current(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	e, err := kv.Get(ctx, policy.Key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("policy: %s %s: %w", kv.Bucket(), policy.Key, err)
	}
	return e.Revision(), nil
}

// PutAt stores f as the new policy only if the bucket's policy is at
// revision rev — rev 0: only if it holds none yet — and returns the new
// revision. Otherwise nothing is written and the error is a
// *ConflictError naming the revision in force. A policy that does not
// validate is refused before anything is written.
func PutAt(ctx context.Context, kv jetstream.KeyValue, f *policy.File, rev uint64) (uint64, error) {
	data, err := policy.Encode(f)
	if err != nil {
		return 0, err
	}
	var newRev uint64
	if rev == 0 {
		newRev, err = kv.Create(ctx, policy.Key, data)
	} else {
		newRev, err = kv.Update(ctx, policy.Key, data, rev)
	}
	if err == nil {
		return newRev, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("policy: put %s %s at revision %d: %w", kv.Bucket(), policy.Key, rev, err)
	}
	cur, cerr := Current(ctx, kv)
	if cerr != nil {
		return 0, fmt.Errorf("policy: the bucket holds another revision than %d, which could not be read: %w", rev, cerr)
	}
	return 0, &ConflictError{Expected: rev, Current: cur}
}

// Replace stores f as the new policy whatever revision is in force, like
// Put, and returns the revision it replaced (0: none) and the new one. It
// reads the revision in force and writes at it, again when another writer
// came first, so the replaced revision is exactly the one f follows.
func Replace(ctx context.Context, kv jetstream.KeyValue, f *policy.File) (replaced, rev uint64, err error) {
	cur, err := Current(ctx, kv)
	if err != nil {
		return 0, 0, err
	}
	for {
		rev, err := PutAt(ctx, kv, f, cur)
		conflict, ok := errors.AsType[*ConflictError](err)
		if !ok {
			if err != nil {
				return 0, 0, err
			}
			return cur, rev, nil
		}
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		cur = conflict.Current // another writer came first: write after it
	}
}

// Standing is which revision of the policy was in force at some revision
// of the bucket — what the services ran then.
type Standing struct {
	// Rev is the revision in force: the newest one at or below the
	// revision asked about that decodes, as Watch takes it (a service that
	// was running kept it; one that started ran it). 0 when none decodes:
	// the built-in defaults.
	Rev uint64
	// Deleted: revision Rev deleted the policy, so the built-in defaults
	// were in force.
	Deleted bool
	// Refused are the newer revisions, up to the one asked about, that do
	// not decode: every service refused them (put behind dispatch policy
	// set's back, with nats kv put). Oldest first.
	Refused []uint64
}

// InForce says which revision was in force when rev was the newest in the
// bucket. When rev itself decodes that is one get; otherwise the bucket's
// history is read, as Watch does at start.
func InForce(ctx context.Context, kv jetstream.KeyValue, rev uint64) (Standing, error) {
	if rev == 0 {
		return Standing{}, nil
	}
	e, err := kv.GetRevision(ctx, policy.Key, rev)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound): // a delete, or purged: the history says which
	case err != nil:
		return Standing{}, fmt.Errorf("policy: %s %s revision %d: %w", kv.Bucket(), policy.Key, rev, err)
	default:
		if _, err := entryFile(e); err == nil {
			return Standing{Rev: rev}, nil
		}
	}
	all, err := kv.History(ctx, policy.Key)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return Standing{}, fmt.Errorf("policy: history of %s %s: %w", kv.Bucket(), policy.Key, err)
	}
	e, _, refused := newestDecoding(all, rev)
	st := Standing{Refused: refused}
	if e != nil {
		st.Rev, st.Deleted = e.Revision(), e.Operation() != jetstream.KeyValuePut
	}
	return st, nil
}

// newestDecoding is the newest entry of the policy's history (oldest
// first, as kv.History returns it) at or below revision upTo that
// decodes, with its file, and the revisions above it that do not (oldest
// first): the revision in force when upTo was the newest. nil: none
// decodes.
func newestDecoding(all []jetstream.KeyValueEntry, upTo uint64) (jetstream.KeyValueEntry, *policy.File, []uint64) {
	var refused []uint64
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Revision() > upTo {
			continue
		}
		f, err := entryFile(all[i])
		if err != nil {
			refused = append([]uint64{all[i].Revision()}, refused...)
			continue
		}
		return all[i], f, refused
	}
	return nil, nil, refused
}

// Seed stores f when the bucket holds no policy yet and returns the
// revision in force: f's when it was stored (seeded true), else the one
// already there, which Seed leaves alone — it may hold changes made while
// the mesh ran, which a restart must not undo.
func Seed(ctx context.Context, kv jetstream.KeyValue, f *policy.File) (rev uint64, seeded bool, err error) {
	data, err := policy.Encode(f)
	if err != nil {
		return 0, false, err
	}
	rev, err = kv.Create(ctx, policy.Key, data)
	if err == nil {
		return rev, true, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return 0, false, fmt.Errorf("policy: seed %s %s: %w", kv.Bucket(), policy.Key, err)
	}
	rev, err = Current(ctx, kv)
	return rev, false, err
}

// Revisions are every revision of the policy the bucket holds, read once:
// what dispatch rebuild replays the stream with.
type Revisions struct {
	bucket string
	files  map[uint64]*policy.File
	errs   map[uint64]error
}

// History reads every revision the bucket holds.
func History(ctx context.Context, kv jetstream.KeyValue) (*Revisions, error) {
	r := &Revisions{bucket: kv.Bucket(), files: map[uint64]*policy.File{}, errs: map[uint64]error{}}
	all, err := kv.History(ctx, policy.Key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("policy: history of %s %s: %w", kv.Bucket(), policy.Key, err)
	}
	for _, e := range all {
		f, err := entryFile(e)
		if err != nil {
			r.errs[e.Revision()] = err
			continue
		}
		r.files[e.Revision()] = f
	}
	return r, nil
}

// At returns the policy of revision rev: nil (built-in defaults) when that
// revision deleted the key. ErrNoRevision when the bucket does not hold it.
func (r *Revisions) At(rev uint64) (*policy.File, error) {
	if rev == 0 {
		return nil, fmt.Errorf("%w: none recorded", ErrNoRevision)
	}
	if f, ok := r.files[rev]; ok {
		return f, nil
	}
	if err, ok := r.errs[rev]; ok {
		// No service ran with it (they refused it too): the event naming
		// it was not published by this mesh.
		return nil, fmt.Errorf("policy revision %d does not decode: %w", rev, err)
	}
	return nil, fmt.Errorf("%w: bucket %s holds no revision %d of %s (purged, or never written)", ErrNoRevision, r.bucket, rev, policy.Key)
}

// At returns the policy of revision rev of the bucket (Revisions.At).
func At(ctx context.Context, kv jetstream.KeyValue, rev uint64) (*policy.File, error) {
	r, err := History(ctx, kv)
	if err != nil {
		return nil, err
	}
	return r.At(rev)
}

// Watch serves the policy in the bucket, following every change with a KV
// watcher on js until ctx ends: a put applies at once. A put that does not
// decode (`nats kv put` of a broken policy) is logged as an error and the
// policy in force stays; a delete puts the built-in defaults in force. At
// start, when the newest revision does not decode, the newest one that
// does is used — the one the running instances kept. An empty bucket
// serves the built-in defaults (revision 0) until a policy is put.
//
// The watcher takes only what its own consumer delivered and reads each
// revision back from the bucket (follow.Watch): a message another consumer
// delivers into its inbox — any user who may create a consumer can aim one
// there — is logged and changes nothing.
func Watch(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, log *slog.Logger) (*policy.Source, error) {
	return WatchWith(ctx, kv, WatchOptions{JS: js, Log: log})
}

// WatchOptions are Watch's options.
type WatchOptions struct {
	// JS is the connection the watcher creates its consumer on. Required:
	// WatchWith fails without it.
	JS jetstream.JetStream
	// Log receives what the watcher says. Default slog.Default().
	Log *slog.Logger
	// Quiet logs which policy is in force ("policy in force", "policy
	// deleted: built-in defaults in force") at debug level: for a one-shot
	// command, whose output is not a log. A service leaves it unset and
	// logs every change. Refusals (a revision that does not decode) are
	// logged as errors and warnings either way.
	Quiet bool
	// Key is the key followed. Default policy.Key (the policy in force);
	// ShadowKey follows the shadow policy, whose absence (a delete) is a
	// Snapshot with no File.
	Key string
}

// ErrNoJetStream is returned by WatchWith without WatchOptions.JS.
var ErrNoJetStream = errors.New("policy: watch: WatchOptions.JS is required (the watcher creates its consumer on it)")

// WatchWith is Watch with options.
func WatchWith(ctx context.Context, kv jetstream.KeyValue, o WatchOptions) (*policy.Source, error) {
	if o.JS == nil {
		return nil, ErrNoJetStream
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	key := o.Key
	if key == "" {
		key = policy.Key
	}
	s := &watcher{src: &policy.Source{}, log: log.With("bucket", kv.Bucket(), "key", key), quiet: o.Quiet, key: key}
	w, err := follow.Watch(ctx, o.JS, kv, key, follow.WatchOptions{Log: log})
	if err != nil {
		return nil, fmt.Errorf("policy: watch %s %s: %w", kv.Bucket(), key, err)
	}
	var first jetstream.KeyValueEntry
	for e := range w.Updates() {
		if e == nil {
			break // the initial value (if any) has been delivered
		}
		first = e
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if first != nil {
		if err := s.start(ctx, o.JS, kv, first); err != nil {
			w.Stop()
			return nil, err
		}
	}
	go func() {
		for e := range w.Updates() {
			if e != nil {
				s.apply(e)
			}
		}
	}()
	return s.src, nil
}

// watcher puts the revisions of the bucket in force in src.
type watcher struct {
	src   *policy.Source
	log   *slog.Logger
	quiet bool // which policy is in force is logged at debug level (WatchOptions.Quiet)
	key   string
}

// start takes the newest revision that decodes, from first backwards (the
// history read as the watch reads: follow.History).
func (s *watcher) start(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, first jetstream.KeyValueEntry) error {
	if s.apply(first) {
		return nil
	}
	all, err := follow.History(ctx, js, kv, s.key, s.log)
	if err != nil {
		return fmt.Errorf("policy: history of %s %s: %w", kv.Bucket(), s.key, err)
	}
	if e, f, _ := newestDecoding(all, first.Revision()-1); e != nil {
		s.src.Store(&policy.Snapshot{File: f, Rev: e.Revision()}, first.Revision())
		s.log.Warn("policy in force is an older revision: the newest does not decode", "rev", e.Revision(), "refused", first.Revision())
		return nil
	}
	s.log.Error("no revision of the policy decodes: built-in defaults in force", "refused", first.Revision())
	return nil
}

// apply takes one change; false when it was refused.
func (s *watcher) apply(e jetstream.KeyValueEntry) bool {
	if seen := s.src.Handled(); e.Revision() <= seen {
		// Revisions only go forward: the one in force delivered again (the
		// watch's first value) changes nothing, and an older one (a
		// replayed consumer) never takes the place of a newer one.
		if e.Revision() < seen {
			s.log.Warn("older policy revision ignored", "rev", e.Revision(), "seen", seen)
		}
		return false
	}
	f, err := entryFile(e)
	if err != nil {
		s.log.Error("policy change refused: the previous policy stays in force",
			"rev", e.Revision(), "in_force", s.src.Rev(), "err", err)
		s.src.Store(nil, e.Revision())
		return false
	}
	s.src.Store(&policy.Snapshot{File: f, Rev: e.Revision()}, e.Revision())
	deleted, applied := slog.LevelWarn, slog.LevelInfo
	if s.quiet {
		deleted, applied = slog.LevelDebug, slog.LevelDebug
	}
	if f == nil {
		s.log.Log(context.Background(), deleted, "policy deleted: built-in defaults in force", "rev", e.Revision())
	} else {
		s.log.Log(context.Background(), applied, "policy in force", "rev", e.Revision())
	}
	return true
}

// entryFile decodes one bucket entry; a delete or purge is nil: the
// built-in defaults.
func entryFile(e jetstream.KeyValueEntry) (*policy.File, error) {
	if e.Operation() != jetstream.KeyValuePut {
		return nil, nil
	}
	return policy.Decode(e.Value())
}
