package policykv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// patience bounds every wait for a watcher: a deadlock guard, not a timing
// assertion.
const patience = 30 * time.Second

// policyBucket provisions the mesh on a fresh server and returns the policy
// bucket.
func policyBucket(t *testing.T) (*natstest.Server, jetstream.KeyValue) {
	t.Helper()
	srv := natstest.Start(t)
	st, err := services.Provision(context.Background(), srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return srv, st.Policy
}

// logBuffer collects what a Source logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func seen(t *testing.T, src *policy.Source, rev uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := src.Seen(ctx, rev); err != nil {
		t.Fatalf("revision %d never reached the watcher: %v", rev, err)
	}
}

// A plain put on the bucket — what `nats kv put dispatch_policy current`
// does — changes the policy of every watching instance; a put that does not
// decode is refused, logged, and the previous policy stays in force; a
// delete brings back the built-in defaults.
func TestWatchFollowsPlainPuts(t *testing.T) {
	srv, kv := policyBucket(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs [2]logBuffer
	var srcs [2]*policy.Source
	for i := range srcs {
		_, js := srv.Connect(t)
		bucket, err := js.KeyValue(ctx, services.BucketPolicy)
		if err != nil {
			t.Fatal(err)
		}
		if srcs[i], err = policykv.Watch(ctx, js, bucket, slog.New(slog.NewTextHandler(&logs[i], nil))); err != nil {
			t.Fatal(err)
		}
		if srcs[i].Rev() != 0 || srcs[i].For("css_fix").Model != "" {
			t.Fatalf("empty bucket: rev %d, %+v", srcs[i].Rev(), srcs[i].For("css_fix"))
		}
	}

	rev1, err := kv.Put(ctx, policy.Key, []byte(`{"types": {"css_fix": {"model": "gpt-4o", "max_retries": 3}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, src := range srcs {
		seen(t, src, rev1)
		if p := src.Snapshot(); p.Rev != rev1 || p.For("css_fix").Model != "gpt-4o" || p.For("css_fix").MaxRetries != 3 {
			t.Fatalf("instance %d after put: rev %d, %+v", i, p.Rev, p.For("css_fix"))
		}
	}

	for _, bad := range []string{
		`{"types": {"css_fix": {"max_retries": -1}}}`,         // Validate
		`{"types": {"css_fix": {"modle": "typo"}}}`,           // unknown field
		`{"types": {"css_fix": `,                              // not JSON
		`{"types": {"css_fix": {"template_file": "x.tmpl"}}}`, // a file on whose disk?
	} {
		rev, err := kv.Put(ctx, policy.Key, []byte(bad))
		if err != nil {
			t.Fatal(err)
		}
		for i, src := range srcs {
			seen(t, src, rev)
			if p := src.Snapshot(); p.Rev != rev1 || p.For("css_fix").Model != "gpt-4o" {
				t.Fatalf("instance %d took the bad policy %s: rev %d, %+v", i, bad, p.Rev, p.For("css_fix"))
			}
			if want := fmt.Sprintf("rev=%d in_force=%d", rev, rev1); !strings.Contains(logs[i].String(), want) {
				t.Fatalf("instance %d did not log the refusal (%s):\n%s", i, want, logs[i].String())
			}
		}
	}
	for i := range logs {
		for _, want := range []string{"policy change refused", "max_retries must not be negative", `unknown field \"modle\"`, "template_file is not allowed"} {
			if !strings.Contains(logs[i].String(), want) {
				t.Errorf("instance %d log lacks %q:\n%s", i, want, logs[i].String())
			}
		}
	}

	if err := kv.Delete(ctx, policy.Key); err != nil {
		t.Fatal(err)
	}
	e, err := kv.History(ctx, policy.Key)
	if err != nil {
		t.Fatal(err)
	}
	del := e[len(e)-1].Revision()
	for i, src := range srcs {
		seen(t, src, del)
		if p := src.Snapshot(); p.Rev != del || p.File != nil || p.For("css_fix").Model != "" {
			t.Fatalf("instance %d after delete: rev %d, %+v", i, p.Rev, p.For("css_fix"))
		}
	}
	// Every revision stays readable, the delete as the built-in defaults.
	f, err := policykv.At(ctx, kv, rev1)
	if err != nil || f.For("css_fix").Model != "gpt-4o" {
		t.Fatalf("revision %d: %v %+v", rev1, err, f)
	}
	if f, err := policykv.At(ctx, kv, del); err != nil || f != nil {
		t.Fatalf("delete revision %d: %v %+v", del, err, f)
	}
}

// An instance that starts when the newest revision does not decode runs the
// newest one that does — the one the running instances kept.
func TestWatchStartsFromNewestValidRevision(t *testing.T) {
	srv, kv := policyBucket(t)
	ctx := context.Background()
	good, err := policykv.Put(ctx, kv, &policy.File{Types: map[string]policy.Type{"a": {Model: "m1"}}})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := kv.Put(ctx, policy.Key, []byte(`{"types": {"a": {"threshold": 7}}}`))
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	src, err := policykv.Watch(ctx, srv.JS, kv, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if src.Rev() != good || src.For("a").Model != "m1" {
		t.Fatalf("started on rev %d (%+v), want %d", src.Rev(), src.For("a"), good)
	}
	seen(t, src, bad)
	if !strings.Contains(logs.String(), "threshold must be within [0, 1]") {
		t.Fatalf("refusal not logged:\n%s", logs.String())
	}
}

// dispatch policy set goes through Put: a policy that does not validate is
// never written.
func TestPutRefusesInvalidPolicy(t *testing.T) {
	_, kv := policyBucket(t)
	ctx := context.Background()
	bad := &policy.File{Types: map[string]policy.Type{"a": {MaxRetries: -2}}}
	if _, err := policykv.Put(ctx, kv, bad); err == nil || !strings.Contains(err.Error(), "max_retries must not be negative") {
		t.Fatalf("Put of an invalid policy: %v", err)
	}
	inlineLess := &policy.File{Types: map[string]policy.Type{"a": {TemplateFile: "a.tmpl"}}}
	if _, err := policykv.Put(ctx, kv, inlineLess); !errors.Is(err, policy.ErrTemplateFile) {
		t.Fatalf("Put of a template file reference: %v", err)
	}
	if _, err := kv.Get(ctx, policy.Key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("something was written: %v", err)
	}
}

// Seed writes only into an empty bucket; a policy already there (perhaps
// changed while the mesh ran) stays.
func TestSeedKeepsExistingPolicy(t *testing.T) {
	_, kv := policyBucket(t)
	ctx := context.Background()
	rev, seeded, err := policykv.Seed(ctx, kv, &policy.File{Types: map[string]policy.Type{"a": {Model: "m1"}}})
	if err != nil || !seeded {
		t.Fatalf("first seed: %d %v %v", rev, seeded, err)
	}
	changed, err := policykv.Put(ctx, kv, &policy.File{Types: map[string]policy.Type{"a": {Model: "m2"}}})
	if err != nil {
		t.Fatal(err)
	}
	again, seeded, err := policykv.Seed(ctx, kv, &policy.File{Types: map[string]policy.Type{"a": {Model: "m1"}}})
	if err != nil || seeded || again != changed {
		t.Fatalf("second seed: rev %d (want %d) seeded %v %v", again, changed, seeded, err)
	}
	f, err := policykv.At(ctx, kv, again)
	if err != nil || f.For("a").Model != "m2" {
		t.Fatalf("seed overwrote the policy: %v %+v", err, f)
	}
}

// The bucket keeps far more revisions than a KV bucket's 64, so rebuild can
// read the policy an old event was decided under; one it does not hold is
// ErrNoRevision, never a default.
func TestBucketKeepsEveryRevision(t *testing.T) {
	_, kv := policyBucket(t)
	ctx := context.Background()
	var revs []uint64
	for i := range 80 {
		rev, err := policykv.Put(ctx, kv, &policy.File{Defaults: policy.Type{PromptBudget: i + 1}})
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, rev)
	}
	for i, rev := range revs {
		f, err := policykv.At(ctx, kv, rev)
		if err != nil {
			t.Fatalf("revision %d (put %d): %v", rev, i+1, err)
		}
		if got := f.For("x").PromptBudget; got != i+1 {
			t.Fatalf("revision %d: prompt_budget %d, want %d", rev, got, i+1)
		}
	}
	for _, rev := range []uint64{0, revs[len(revs)-1] + 5} {
		if _, err := policykv.At(ctx, kv, rev); !errors.Is(err, policykv.ErrNoRevision) {
			t.Fatalf("revision %d: %v, want ErrNoRevision", rev, err)
		}
	}
}

// PutAt writes only at the expected revision (0: none yet) and names the
// revision in force when it is another; Replace writes whatever is in
// force and says which revision it replaced.
func TestPutAtAndReplace(t *testing.T) {
	_, kv := policyBucket(t)
	ctx := context.Background()
	v := func(model string) *policy.File {
		return &policy.File{Types: map[string]policy.Type{"a": {Model: model}}}
	}
	first, err := policykv.PutAt(ctx, kv, v("m1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	var conflict *policykv.ConflictError
	if _, err := policykv.PutAt(ctx, kv, v("m2"), 0); !errors.As(err, &conflict) || !errors.Is(err, policykv.ErrRevisionConflict) ||
		*conflict != (policykv.ConflictError{Expected: 0, Current: first}) {
		t.Fatalf("PutAt 0 over revision %d: %v", first, err)
	}
	second, err := policykv.PutAt(ctx, kv, v("m2"), first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policykv.PutAt(ctx, kv, v("m3"), first); !errors.As(err, &conflict) || *conflict != (policykv.ConflictError{Expected: first, Current: second}) {
		t.Fatalf("PutAt %d over revision %d: %v", first, second, err)
	}
	if cur, err := policykv.Current(ctx, kv); err != nil || cur != second {
		t.Fatalf("a refused PutAt wrote: current %d (want %d) %v", cur, second, err)
	}
	replaced, third, err := policykv.Replace(ctx, kv, v("m3"))
	if err != nil || replaced != second || third <= second {
		t.Fatalf("Replace: replaced %d (want %d), new %d, %v", replaced, second, third, err)
	}
	if err := kv.Delete(ctx, policy.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := policykv.PutAt(ctx, kv, v("m4"), third); !errors.As(err, &conflict) || *conflict != (policykv.ConflictError{Expected: third, Current: 0}) {
		t.Fatalf("PutAt %d after a delete: %v", third, err)
	}
	if replaced, _, err := policykv.Replace(ctx, kv, v("m4")); err != nil || replaced != 0 {
		t.Fatalf("Replace after a delete: replaced %d, %v", replaced, err)
	}
	if _, err := policykv.PutAt(ctx, kv, &policy.File{Types: map[string]policy.Type{"a": {MaxRetries: -1}}}, 0); err == nil || errors.Is(err, policykv.ErrRevisionConflict) {
		t.Fatalf("PutAt of an invalid policy: %v", err)
	}
}

// InForce names the revision the services ran when a revision was the
// newest in the bucket: itself when it decodes, else the newest one before
// it that does (a delete: the built-in defaults), with those refused.
func TestInForceSkipsRefusedRevisions(t *testing.T) {
	_, kv := policyBucket(t)
	ctx := context.Background()
	put := func(v string) uint64 {
		t.Helper()
		rev, err := kv.Put(ctx, policy.Key, []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	check := func(rev uint64, want policykv.Standing) {
		t.Helper()
		got, err := policykv.InForce(ctx, kv, rev)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("in force at revision %d: %+v, want %+v", rev, got, want)
		}
	}
	check(0, policykv.Standing{})
	bad1 := put(`{"types": {"css_fix": {"modle": "x"}}}`) // nothing decodes yet
	check(bad1, policykv.Standing{Refused: []uint64{bad1}})
	good := put(`{"types": {"css_fix": {"model": "m"}}}`)
	check(good, policykv.Standing{Rev: good})
	bad2, bad3 := put(`{"types": {"css_fix": {"max_retries": -1}}}`), put(`not json`)
	check(bad3, policykv.Standing{Rev: good, Refused: []uint64{bad2, bad3}})
	check(bad2, policykv.Standing{Rev: good, Refused: []uint64{bad2}})
	if err := kv.Delete(ctx, policy.Key); err != nil {
		t.Fatal(err)
	}
	bad4 := put(`{"types": {"Bad Type": {}}}`)
	check(bad4, policykv.Standing{Rev: bad4 - 1, Deleted: true, Refused: []uint64{bad4}})
	check(bad4-1, policykv.Standing{Rev: bad4 - 1, Deleted: true})
}

// A quiet watcher (a one-shot command's) logs which policy is in force at
// debug level; a service's at info; refusals are errors either way.
func TestWatchQuietLogsInForceAtDebug(t *testing.T) {
	srv, kv := policyBucket(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	good, err := policykv.Put(ctx, kv, &policy.File{Types: map[string]policy.Type{"a": {Model: "m1"}}})
	if err != nil {
		t.Fatal(err)
	}
	watch := func(quiet bool, level slog.Level) (*policy.Source, *logBuffer) {
		var logs logBuffer
		src, err := policykv.WatchWith(ctx, kv, policykv.WatchOptions{
			JS: srv.JS, Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level})), Quiet: quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		return src, &logs
	}
	quiet, quietLogs := watch(true, slog.LevelInfo)
	debug, debugLogs := watch(true, slog.LevelDebug)
	loud, loudLogs := watch(false, slog.LevelInfo)
	bad, err := kv.Put(ctx, policy.Key, []byte(`{"types": {"a": {"modle": "x"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range []*policy.Source{quiet, debug, loud} {
		seen(t, src, bad)
		if src.Rev() != good {
			t.Fatalf("in force: revision %d, want %d", src.Rev(), good)
		}
	}
	inForce := fmt.Sprintf(`msg="policy in force" bucket=dispatch_policy key=current rev=%d`, good)
	if s := quietLogs.String(); strings.Contains(s, "policy in force") || !strings.Contains(s, "level=ERROR msg=\"policy change refused") {
		t.Errorf("quiet watcher at info logged:\n%s", s)
	}
	if s := debugLogs.String(); !strings.Contains(s, "level=DEBUG "+inForce) {
		t.Errorf("quiet watcher at debug logged:\n%s", s)
	}
	if s := loudLogs.String(); !strings.Contains(s, "level=INFO "+inForce) || !strings.Contains(s, "policy change refused") {
		t.Errorf("service watcher logged:\n%s", s)
	}
}
