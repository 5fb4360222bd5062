package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// policyMesh is a mesh whose css_fix runs on model "first", a CLI on it
// and its policy bucket.
func policyMesh(t *testing.T) (*reviewtest.Mesh, *cli, jetstream.KeyValue) {
	t.Helper()
	m := reviewtest.Start(t, func(_ int, r openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("fixed")}
	}, reviewtest.Options{Policy: &policy.File{Types: map[string]policy.Type{"css_fix": {Model: "first"}}}})
	kv, err := m.Srv.JS.KeyValue(context.Background(), services.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	return m, newCLI(t, m), kv
}

// dispatch policy validate, set and get against a running mesh: an invalid
// file is refused and nothing changes; a valid one (its template file
// inlined) is in force in the services at once; get prints what the bucket
// holds and says when its newest revision is one no service runs; rebuild
// recomputes from the bucket's revisions without any file.
func TestPolicyCommands(t *testing.T) {
	m, c, kv := policyMesh(t)
	ctx := context.Background()
	newest := func() uint64 {
		t.Helper()
		e, err := kv.Get(ctx, policy.Key)
		if err != nil {
			t.Fatal(err)
		}
		return e.Revision()
	}
	before := newest()

	dir := t.TempDir()
	tmpl := writeFile(t, dir, "css.tmpl", "Fix {{.Task.Subject}} by the book")
	good := writeFile(t, dir, "good.json", `{"types": {"css_fix": {"model": "second", "template_file": "`+tmpl+`"}}}`)
	bad := writeFile(t, dir, "bad.json", `{"types": {"css_fix": {"max_retries": -1, "threshold": 3}}}`)
	missingTmpl := writeFile(t, dir, "missing.json", `{"types": {"css_fix": {"template_file": "`+filepath.Join(dir, "gone.tmpl")+`"}}}`)

	if out := c.ok("policy", "validate", good); !strings.Contains(out, "valid (1 types: css_fix)") {
		t.Fatalf("validate of a good file: %s", out)
	}
	for _, cmd := range []string{"validate", "set"} {
		_, err := c.run("policy", cmd, bad)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 1 {
			t.Fatalf("policy %s of a bad file: %v", cmd, err)
		}
		for _, want := range []string{"invalid policy, nothing changed", "max_retries must not be negative", "threshold must be within [0, 1]"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("policy %s: error lacks %q: %v", cmd, want, err)
			}
		}
		if _, err := c.run("policy", cmd, missingTmpl); err == nil || !strings.Contains(err.Error(), "gone.tmpl") {
			t.Errorf("policy %s of a file naming a missing template: %v", cmd, err)
		}
	}
	if _, err := c.run("policy", "set"); err == nil || !strings.Contains(err.Error(), "one policy file is required") {
		t.Errorf("policy set without a file: %v", err)
	}
	if got := newest(); got != before {
		t.Fatalf("a refused set wrote revision %d (was %d)", got, before)
	}

	out := c.ok("policy", "set", good)
	rev := newest()
	if rev == before || !strings.Contains(out, "policy revision ") || !strings.Contains(out, "in force") {
		t.Fatalf("set: revision %d (was %d): %s", rev, before, out)
	}
	seenCtx, cancel := context.WithTimeout(ctx, reviewtest.Patience)
	defer cancel()
	if err := m.Policy.Seen(seenCtx, rev); err != nil {
		t.Fatal(err)
	}
	if p := m.Policy.For("css_fix"); p.Model != "second" || p.Template != "Fix {{.Task.Subject}} by the book" || p.TemplateFile != "" {
		t.Fatalf("in force after set: %+v", p)
	}

	got := c.ok("policy", "get")
	if !strings.Contains(got, `"model": "second"`) || !strings.Contains(got, "by the book") || strings.Contains(got, "template_file") {
		t.Fatalf("get: the template is not inline:\n%s", got)
	}
	if old := c.ok("policy", "get", "-rev", strconv.FormatUint(before, 10)); !strings.Contains(old, `"model": "first"`) {
		t.Fatalf("get -rev %d:\n%s", before, old)
	}

	// A task under the new revision, then a rebuild with no policy file.
	m.Submit(events.Submit{ID: "p-1", Type: "css_fix", Subject: "a.css"})
	m.WaitStage("p-1", events.StageSucceeded, 1)
	if out := c.ok("rebuild"); !strings.Contains(out, "the live stores agree with the stream") {
		t.Fatalf("rebuild: %s", out)
	}

	// Behind our back: `nats kv put` of something that is not a policy.
	badRev, err := kv.Put(ctx, policy.Key, []byte(`{"types": {"css_fix": {"model": 42}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Policy.Seen(seenCtx, badRev); err != nil {
		t.Fatal(err)
	}
	if m.Policy.Rev() != rev || m.Policy.For("css_fix").Model != "second" {
		t.Fatalf("the bad put was taken: rev %d, %+v", m.Policy.Rev(), m.Policy.For("css_fix"))
	}
	_, err = c.run("policy", "get")
	if err == nil || !strings.Contains(err.Error(), "does not decode, so no service runs it") {
		t.Fatalf("get of a bad revision: %v", err)
	}

	// An event decided under a revision the bucket does not hold (another
	// mesh's, or purged): rebuild says so instead of guessing a policy. (An
	// attempt of p-1, which ended: no recorder acts on it, so no later
	// event names the revision it is to be recorded under.)
	ghost, err := json.Marshal(events.Executed{Base: events.Base{
		Task: events.Task{ID: "p-1", Type: "css_fix", Subject: "a.css"}, Run: events.Run{Pass: 2, Attempt: 2},
		At: time.Now().UTC(), By: "executor@elsewhere", PolicyRev: 999,
	}, Result: events.Result{Outcome: events.OutcomeSuccess}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Srv.JS.Publish(ctx, events.TaskSubject("p-1", events.StageExecuted), ghost); err != nil {
		t.Fatal(err)
	}
	_, err = c.run("rebuild")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), "policy revision 999, named by 1 events") ||
		!strings.Contains(err.Error(), "holds no revision 999") {
		t.Fatalf("rebuild with an unavailable revision: %v", err)
	}
	out, _ = c.run("rebuild", "-policy", good)
	if !strings.Contains(out, "recomputed with "+good+": policy revision 999, named by 1 events") {
		t.Fatalf("rebuild -policy:\n%s", out)
	}
}

// dispatch policy set -rev N writes only over revision N (0: over no
// policy); a stale revision changes nothing and names the one in force.
// Without -rev, set says which revision it replaced; get prints the
// revision on stderr, the document alone on stdout.
func TestPolicySetCompareAndSet(t *testing.T) {
	_, c, kv := policyMesh(t)
	ctx := context.Background()
	current := func() uint64 {
		t.Helper()
		rev, err := policykv.Current(ctx, kv)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	dir := t.TempDir()
	file := func(model string) string {
		return writeFile(t, dir, model+".json", `{"types": {"css_fix": {"model": "`+model+`"}}}`)
	}
	rev := func(n uint64) string { return strconv.FormatUint(n, 10) }

	// get: the document on stdout (it parses as a policy), the revision on stderr.
	r0 := current()
	var doc, errOut bytes.Buffer
	oldOut, oldErr := stdout, stderr
	stdout, stderr = &doc, &errOut
	err := run(ctx, []string{"policy", "get"})
	stdout, stderr = oldOut, oldErr
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Decode(doc.Bytes()); err != nil {
		t.Fatalf("get printed more than the policy on stdout: %v\n%s", err, doc.String())
	}
	if !strings.Contains(errOut.String(), "policy revision "+rev(r0)+",") {
		t.Fatalf("get printed no revision %d on stderr: %q", r0, errOut.String())
	}

	// Without -rev: as before, and it says what it replaced.
	out := c.ok("policy", "set", file("second"))
	r1 := current()
	if want := "policy revision " + rev(r1) + " in force"; !strings.Contains(out, want) || !strings.Contains(out, "replacing revision "+rev(r0)) {
		t.Fatalf("set: %s\nwant %q, replacing revision %d", out, want, r0)
	}

	// -rev of the revision in force: written.
	out = c.ok("policy", "set", "-rev", rev(r1), file("third"))
	r2 := current()
	if r2 == r1 || !strings.Contains(out, "policy revision "+rev(r2)+" in force") || !strings.Contains(out, "replacing revision "+rev(r1)) {
		t.Fatalf("set -rev %d: revision %d: %s", r1, r2, out)
	}
	if e, err := kv.Get(ctx, policy.Key); err != nil || !strings.Contains(string(e.Value()), `"third"`) {
		t.Fatalf("after set -rev %d: %v", r1, err)
	}

	// A stale -rev (the other operator's write came first), and -rev 0 over a
	// policy: refused, nothing written, the revision in force named.
	for _, stale := range []uint64{r1, 0} {
		_, err := c.run("policy", "set", "-rev", rev(stale), file("lost"))
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 1 {
			t.Fatalf("set -rev %d over revision %d: %v", stale, r2, err)
		}
		for _, want := range []string{"nothing changed", "revision " + rev(r2) + " is in force", "dispatch policy get", "retry with -rev " + rev(r2)} {
			if stale != 0 && want == "revision "+rev(r2)+" is in force" {
				want = "the current revision is " + rev(r2)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("set -rev %d: error lacks %q: %v", stale, want, err)
			}
		}
		if got := current(); got != r2 {
			t.Fatalf("a refused set -rev %d wrote revision %d (was %d)", stale, got, r2)
		}
	}

	// No policy in the bucket: -rev 0 creates it; -rev N says there is none.
	if err := kv.Delete(ctx, policy.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := c.run("policy", "set", "-rev", rev(r2), file("lost")); err == nil ||
		!strings.Contains(err.Error(), "holds no policy") || !strings.Contains(err.Error(), "retry with -rev 0") {
		t.Fatalf("set -rev %d over no policy: %v", r2, err)
	}
	out = c.ok("policy", "set", "-rev", "0", file("fourth"))
	if r3 := current(); r3 <= r2 || !strings.Contains(out, "policy revision "+rev(r3)+" in force") || !strings.Contains(out, "the bucket held no policy") {
		t.Fatalf("set -rev 0 over no policy: revision %d: %s", r3, out)
	}
	if _, err := c.run("policy", "set", "-rev", "-1", file("lost")); err == nil {
		t.Fatal("set -rev -1 was accepted")
	}
	if _, err := c.run("policy", "set", file("lost"), "-rev", "1"); err == nil || !strings.Contains(err.Error(), "flags go before FILE") {
		t.Fatalf("set FILE -rev 1: %v", err)
	}
}

// dispatch up seeds the empty policy bucket from DISPATCH_POLICY_FILE, its
// template files inlined; a later up with another file keeps what the
// bucket holds and says the file was not applied.
func TestUpSeedsPolicyBucket(t *testing.T) {
	dataDir, dir := t.TempDir(), t.TempDir()
	tmpl := writeFile(t, dir, "css.tmpl", "Seeded template for {{.Task.Subject}}")
	first := writeFile(t, dir, "first.json", `{"types": {"css_fix": {"model": "seeded", "template_file": "`+tmpl+`"}}}`)
	second := writeFile(t, dir, "second.json", `{"types": {"css_fix": {"model": "other"}}}`)

	out, url, kill := startUpWith(t, dataDir, "DISPATCH_POLICY_FILE="+first)
	if !strings.Contains(out, "policy:   bucket dispatch_policy, revision 1 (seeded from "+first+")") {
		t.Fatalf("banner:\n%s", out)
	}
	value := policyValue(t, url)
	if !strings.Contains(value, "Seeded template for") || strings.Contains(value, "template_file") || !strings.Contains(value, `"seeded"`) {
		t.Fatalf("the bucket holds:\n%s", value)
	}
	kill()

	out, url, _ = startUpWith(t, dataDir, "DISPATCH_POLICY_FILE="+second)
	if !strings.Contains(out, "revision 1 (already there); "+second+" differs and was NOT applied: dispatch policy set "+second) {
		t.Fatalf("banner of the second up:\n%s", out)
	}
	if again := policyValue(t, url); again != value {
		t.Fatalf("the second up changed the policy:\n%s", again)
	}
}

func startUpWith(t *testing.T, dataDir string, env ...string) (banner, url string, kill func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := upCommand(ctx, dataDir)
	cmd.Env = append(cmd.Env, env...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	kill = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(kill)
	waitUpBanner(t, &out, done)
	m := natsURL.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("dispatch up printed no NATS URL:\n%s", out.String())
	}
	return out.String(), m[1], kill
}

func waitUpBanner(t *testing.T, out *syncBuffer, done <-chan error) {
	t.Helper()
	// A deadlock guard, not a timing assertion: generous, since a second
	// `dispatch up` recovering its store on two cores the fault suite
	// keeps busy took over 30 s once.
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(out.String(), "  submit:") {
		select {
		case err := <-done:
			t.Fatalf("dispatch up exited: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dispatch up never came up:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func policyValue(t *testing.T, url string) string {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, services.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, policy.Key)
	if err != nil {
		t.Fatal(err)
	}
	return string(e.Value())
}

// dispatch policy set names the revision it replaced as the one in force:
// not the newest in the bucket when newer puts were refused by every
// service (nats kv put of something that does not decode).
func TestPolicySetNamesTheRevisionInForce(t *testing.T) {
	m, c, kv := policyMesh(t)
	ctx := context.Background()
	inForce, err := policykv.Current(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	var refused []string
	for _, bad := range []string{`{"types": {"css_fix": {"max_retries": -1}}}`, `{"types": {"css_fix": {"modle": "x"}}}`} {
		rev, err := kv.Put(ctx, policy.Key, []byte(bad))
		if err != nil {
			t.Fatal(err)
		}
		refused = append(refused, strconv.FormatUint(rev, 10))
	}
	newest, _ := strconv.ParseUint(refused[1], 10, 64)
	seenCtx, cancel := context.WithTimeout(ctx, reviewtest.Patience)
	defer cancel()
	if err := m.Policy.Seen(seenCtx, newest); err != nil || m.Policy.Rev() != inForce {
		t.Fatalf("the services run revision %d (%v), want %d", m.Policy.Rev(), err, inForce)
	}
	dir := t.TempDir()
	want := "replacing revision " + strconv.FormatUint(inForce, 10) + ", the one in force (revisions " + strings.Join(refused, ", ") +
		", newer in the bucket, did not decode and every service refused them)"
	out := c.ok("policy", "set", writeFile(t, dir, "second.json", `{"types": {"css_fix": {"model": "second"}}}`))
	if !strings.Contains(out, want) {
		t.Fatalf("set over refused revisions:\n%s\nwant %q", out, want)
	}
	// Once the set is in force, the next one replaces it plainly.
	second, err := policykv.Current(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	out = c.ok("policy", "set", "-rev", strconv.FormatUint(second, 10), writeFile(t, dir, "third.json", `{"types": {"css_fix": {"model": "third"}}}`))
	if want := "replacing revision " + strconv.FormatUint(second, 10) + ")"; !strings.Contains(out, want) {
		t.Fatalf("set -rev %d:\n%s\nwant %q", second, out, want)
	}
}

// One-shot commands log which policy is in force at debug level only; the
// review page, long-running on its own connection, logs it at info, as the
// services do.
func TestOneShotCommandsDoNotLogThePolicyInForce(t *testing.T) {
	m := reviewtest.Start(t, func(_ int, r openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("fixed")}
	}, reviewtest.Options{})
	url := m.Srv.ClientURL()
	m.Submit(events.Submit{ID: "q-1", Type: "css_fix", Subject: "a.css"})
	m.WaitStage("q-1", events.StageSucceeded, 1)
	for _, args := range [][]string{
		{"review", "list", "-all"}, {"review", "show", "q-1"}, {"audit", "q-1"}, {"tasks"}, {"status", "-v", "q-1"}, {"policy", "get"},
	} {
		out, code := runDispatch(t, url, args...)
		if code != 0 || strings.Contains(out, "policy in force") || strings.Contains(out, "level=INFO") {
			t.Errorf("dispatch %s exited %d and logged:\n%s", strings.Join(args, " "), code, out)
		}
	}
	t.Setenv("DISPATCH_LOG_LEVEL", "debug")
	if out, code := runDispatch(t, url, "review", "show", "q-1"); code != 0 || !strings.Contains(out, `level=DEBUG msg="policy in force"`) {
		t.Errorf("review show at debug level exited %d:\n%s", code, out)
	}

	// The review page's watcher, on a connection of its own, logs at info.
	for _, c := range []struct {
		name string
		want string
	}{{cliConn, ""}, {"web", `level=INFO msg="policy in force"`}} {
		nc, err := nats.Connect(url, nats.Name(c.name))
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		ctx, cancel := context.WithCancel(context.Background())
		if _, err := watchPolicy(ctx, js, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
			t.Fatal(err)
		}
		cancel()
		nc.Close()
		if got := logs.String(); (c.want == "" && got != "") || !strings.Contains(got, c.want) {
			t.Errorf("watchPolicy on a connection named %q logged %q, want %q", c.name, got, c.want)
		}
	}
}
