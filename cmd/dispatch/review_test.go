package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// cli runs the dispatch command against the mesh and returns what it printed.
type cli struct {
	t *testing.T
	m *reviewtest.Mesh
}

func newCLI(t *testing.T, m *reviewtest.Mesh) *cli {
	t.Setenv("NATS_URL", m.Srv.ClientURL())
	t.Setenv("USER", "tester")
	return &cli{t: t, m: m}
}

func (c *cli) run(args ...string) (string, error) {
	c.t.Helper()
	var buf bytes.Buffer
	old, oldErr := stdout, stderr
	stdout, stderr = &buf, io.Discard
	defer func() { stdout, stderr = old, oldErr }()
	err := run(context.Background(), args)
	return buf.String(), err
}

func (c *cli) ok(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("dispatch %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// The audit of a task that went gate block → requeue → two attempts →
// success. Needs the lead's recorder to carry Run.Reviewed through the
// round's retries: otherwise the second attempt is gated again.
func TestAuditOfGatedRequeuedTask(t *testing.T) {
	script := func(n int, _ openaitest.Request) openaitest.Reply {
		if n <= 2 { // the warm-up task's attempt and the requeued task's first
			return openaitest.Reply{Content: openaitest.Failure("guess "+string(rune('0'+n)), "still misaligned")}
		}
		return openaitest.Reply{Content: openaitest.Success("flexbox on the parent")}
	}
	m := reviewtest.Start(t, script, reviewtest.Options{Scoring: trust.Policy{MinOutcomes: 1}})
	c := newCLI(t, m)
	m.Submit(events.Submit{ID: "warm-1", Type: "css_fix", Subject: "a.css", MaxRetries: 1})
	m.WaitStage("warm-1", "review.escalated", 1) // css_fix now scores 0: the gate holds it
	// The recorder may store warm-1's end just after its record: until it
	// is stored, css_fix has no settled task, and aud-1 would first wait
	// for canaries (a second held event) before the gate holds it for trust.
	waitEnded(t, m, "css_fix")
	m.Submit(events.Submit{ID: "aud-1", Type: "css_fix", Subject: "b.css", MaxRetries: 3})
	// A human may act on a held task at once. Its first held event may be
	// a wait for canaries (the gate parks a pass of a type its view still
	// shows unproven, reading nothing): the hold for trust follows.
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := m.Tasks.Get(t.Context(), "aud-1")
		if err == nil && st.Status == events.StatusHeld {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("aud-1 never held: %s (%v)", st.Status, err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	out := c.ok("review", "requeue", "aud-1", "-note", "the selector is right, try again", "-by", "alice@desk")
	if !strings.Contains(out, "aud-1: requeue by alice@desk (status pending)") {
		t.Fatalf("requeue said %q", out)
	}
	m.WaitStage("aud-1", events.StageSucceeded, 1)

	text := c.ok("audit", "aud-1")
	// Every event, in order, with who handled it. css_fix has no verifier:
	// intake and the recorder send its passes straight to the gate
	// (verified); a human's requeue goes through the verifier (retry).
	want := []string{"verified", "held", "retry", "verified", "admitted", "prompted", "executed",
		"verified", "admitted", "prompted", "executed", "succeeded"}
	var got []string
	line := regexp.MustCompile(`(?m)^(\d+)\s+(\d{4}-\S+)\s+(\S+)\s+(\S+)\s+(.*)$`)
	for _, mm := range line.FindAllStringSubmatch(text, -1) {
		if mm[3] == "review.action" {
			if mm[4] != "human:alice@desk" || !strings.Contains(mm[5], `REQUEUE by alice@desk: "the selector is right, try again"`) {
				t.Errorf("action line = %q", mm[0])
			}
			continue
		}
		got = append(got, mm[3])
		if mm[4] == "-" {
			t.Errorf("no instance named on %q", mm[0])
		}
		if _, err := time.Parse(time.RFC3339Nano, mm[2]); err != nil {
			t.Errorf("time of %q: %v", mm[0], err)
		}
	}
	if got = withoutCanaryWait(got); !slices.Equal(got, want) {
		t.Fatalf("audit stages = %v\nwant %v\n%s", got, want, text)
	}
	for _, s := range []string{"task aud-1: css_fix on b.css, status succeeded", "2 attempts", "requeued by alice@desk",
		"Blocked: css_fix trust score 0.00 below 0.15", "gate@test", "keeps records for 30d"} {
		if !strings.Contains(text, s) {
			t.Errorf("audit text lacks %q:\n%s", s, text)
		}
	}

	var a review.Audit
	if err := json.Unmarshal([]byte(c.ok("audit", "aud-1", "-o", "json")), &a); err != nil {
		t.Fatal(err)
	}
	if a.Task == nil || a.Task.Status != events.StatusSucceeded || len(a.Task.History) != 2 || len(a.Task.Actions) != 1 {
		t.Fatalf("audit json task = %+v", a.Task)
	}
	var stages []string
	for _, e := range a.Events {
		if e.Who == "" || e.Time.IsZero() || e.Seq == 0 {
			t.Errorf("event %+v lacks who, time or seq", e.Entry)
		}
		if e.Stage != "review.action" {
			stages = append(stages, e.Stage)
		}
	}
	if stages = withoutCanaryWait(stages); !slices.Equal(stages, want) {
		t.Fatalf("audit json stages = %v", stages)
	}
}

// withoutCanaryWait drops from stages a wait for canaries before the hold
// for trust — a held event, and the sweeper's wake of it if any — which
// comes when the gate's view had not yet seen the warm-up's end.
func withoutCanaryWait(stages []string) []string {
	i := slices.Index(stages, "held")
	switch {
	case i >= 0 && len(stages) > i+2 && stages[i+1] == "wake" && stages[i+2] == "held":
		return slices.Delete(stages, i, i+2)
	case i >= 0 && len(stages) > i+1 && stages[i+1] == "held":
		return slices.Delete(stages, i, i+1)
	}
	return stages
}

func TestReviewCommands(t *testing.T) {
	const note = "use the v2 endpoint"
	m := reviewtest.Start(t, reviewtest.FailUnless(note), reviewtest.Options{})
	c := newCLI(t, m)
	for _, id := range []string{"cli-1", "cli-2", "cli-3", "cli-4"} {
		typ := "api_fix"
		if id == "cli-4" {
			typ = "doc_fix"
		}
		m.Submit(events.Submit{ID: id, Type: typ, Subject: id + ".go", MaxRetries: 1})
		m.WaitStage(id, "review.escalated", 1)
	}

	out := c.ok("review", "list")
	for _, s := range []string{"cli-1", "cli-4", "escalated", "blocked", "4 open items, newest first; this page read 4 review records and human decisions", "keeps records for 30d"} {
		if !strings.Contains(out, s) {
			t.Errorf("review list lacks %q:\n%s", s, out)
		}
	}
	if strings.Index(out, "cli-4") > strings.Index(out, "cli-1") || strings.Contains(out, "older:") {
		t.Errorf("review list is not newest first on one page:\n%s", out)
	}
	// A page at a time: each page prints the command for the next.
	out = c.ok("review", "list", "-limit", "2", "-type", "api_fix")
	next := regexp.MustCompile(`(?m)^older: dispatch review list -limit 2 -type api_fix -cursor (\w+)$`).FindStringSubmatch(out)
	if next == nil || !strings.Contains(out, "cli-3") || !strings.Contains(out, "cli-2") || strings.Contains(out, "cli-1") {
		t.Fatalf("first page of 2:\n%s", out)
	}
	out = c.ok("review", "list", "-limit", "2", "-type", "api_fix", "-cursor", next[1])
	if !strings.Contains(out, "cli-1") || strings.Contains(out, "cli-2") || strings.Contains(out, "older:") {
		t.Fatalf("second page:\n%s", out)
	}
	out = c.ok("review", "show", "cli-1")
	for _, s := range []string{"status   blocked", "ATTEMPTS", "still broken", "DEAD ENDS", "REVIEW RECORDS", "recorder@test", "actions  resolve, reject, requeue"} {
		if !strings.Contains(out, s) {
			t.Errorf("review show lacks %q:\n%s", s, out)
		}
	}
	var d review.Detail
	if err := json.Unmarshal([]byte(c.ok("review", "show", "cli-1", "-o", "json")), &d); err != nil || d.Task == nil || len(d.Attempts) != 1 {
		t.Fatalf("show -o json: %v %+v", err, d)
	}

	if out := c.ok("review", "resolve", "cli-1", "-note", "done by hand"); !strings.Contains(out, "cli-1: resolve by tester@") {
		t.Errorf("resolve said %q", out)
	}
	c.ok("review", "reject", "cli-2", "-note", "obsolete")
	if _, err := c.run("review", "reject", "cli-2", "-note", "again"); !errors.Is(err, review.ErrNotReviewable) {
		t.Errorf("second reject: %v", err)
	}
	if _, err := c.run("review", "requeue", "cli-3"); !errors.Is(err, review.ErrInvalid) {
		t.Errorf("requeue without a note: %v", err)
	}

	// Bulk: every open escalated api_fix (only cli-3 is left of them).
	out = c.ok("review", "requeue", "-type", "api_fix", "-reason", "escalated", "-note", note)
	if !strings.Contains(out, "requeued cli-3") || !strings.Contains(out, "1 requeued, 0 skipped") {
		t.Fatalf("bulk requeue said %q", out)
	}
	m.WaitStage("cli-3", events.StageSucceeded, 1)

	out = c.ok("review", "list")
	if !strings.Contains(out, "cli-4") || strings.Contains(out, "cli-1") || !strings.Contains(out, "handled are hidden; -all lists them") ||
		!strings.Contains(out, "1 open item, newest first; this page read 7 review records and human decisions") {
		t.Errorf("list after the actions:\n%s", out)
	}
	var q review.Queue
	if err := json.Unmarshal([]byte(c.ok("review", "list", "-all", "-o", "json")), &q); err != nil {
		t.Fatal(err)
	}
	open := 0
	for _, it := range q.Items {
		if it.Open() {
			open++
		}
	}
	if len(q.Items) != 4 || open != 1 || q.Scanned != 7 || q.Next != "" { // 4 records, 3 decisions
		t.Fatalf("list -all: %d items, %d open, read %d", len(q.Items), open, q.Scanned)
	}
	out = c.ok("review", "list", "-all", "-type", "api_fix")
	if !strings.Contains(out, "handled: resolve by tester@") || !strings.Contains(out, "handled: requeue by tester@") {
		t.Errorf("list -all does not show who handled items:\n%s", out)
	}
	if _, err := c.run("review", "list", "-reason", "Bad!"); err == nil {
		t.Error("a bad reason was accepted")
	}
	// Several at once, each with the decisions seen: cli-1 was resolved
	// since (it holds one), so that decision stands and is named.
	out, err := c.run("review", "reject", "cli-4@0", "cli-1@0", "-note", "obsolete")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(out, "rejected cli-4 (status failed)") ||
		!regexp.MustCompile(`skipped cli-1: tester@\S+ decided it since`).MatchString(out) || !strings.Contains(out, "1 rejected, 1 skipped") {
		t.Errorf("bulk reject said %q, %v", out, err)
	}
}

func TestUpAndWebRefuseNonLocalWithoutToken(t *testing.T) {
	t.Setenv("DISPATCH_HTTP_LISTEN", "0.0.0.0:0")
	t.Setenv("DISPATCH_NATS_LISTEN", "127.0.0.1:-1")
	t.Setenv("DISPATCH_DATA_DIR", t.TempDir())
	for _, cmd := range []string{"up", "web"} {
		err := run(context.Background(), []string{cmd})
		if !errors.Is(err, web.ErrTokenRequired) || !strings.Contains(err.Error(), "DISPATCH_HTTP_TOKEN") {
			t.Errorf("dispatch %s beyond localhost without a token: %v", cmd, err)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runWeb runs `dispatch web args...` with stdout captured until the
// output matches printed, and returns printed's first group, the output
// and stop, which ends the command and returns its error (called at the
// test's end at the latest).
func runWeb(t *testing.T, printed *regexp.Regexp, args ...string) (string, *syncBuffer, func() error) {
	t.Helper()
	var buf syncBuffer
	old := stdout
	stdout = &buf
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"web"}, args...)) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			err = <-done
			stdout = old
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	deadline := time.Now().Add(reviewtest.Patience) // a deadlock guard
	for !printed.MatchString(buf.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("dispatch web printed no address: %q", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return printed.FindStringSubmatch(buf.String())[1], &buf, stop
}

func TestWebCommandServesWithToken(t *testing.T) {
	m := reviewtest.Start(t, reviewtest.FailUnless("x"), reviewtest.Options{})
	newCLI(t, m)
	t.Setenv("DISPATCH_HTTP_TOKEN", "s3cret")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := "http://" + ln.Addr().String()
	ln.Close()
	t.Setenv("DISPATCH_METRICS_LISTEN", strings.TrimPrefix(metrics, "http://"))
	base, buf, stop := runWeb(t, regexp.MustCompile(`(http://[^/ ]+/)`), "-listen", "0.0.0.0:0")
	if strings.Contains(buf.String(), "s3cret") {
		t.Error("dispatch web printed its token")
	}
	get := func(auth string) int {
		req, _ := http.NewRequest("GET", base+"api/review", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(""); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d", code)
	}
	if code := get("Bearer s3cret"); code != http.StatusOK {
		t.Errorf("with the token: %d", code)
	}

	// Outside the token: /readyz, and /metrics with the review queue.
	for path, want := range map[string]string{
		"/readyz":  "ready\n",
		"/healthz": "ok\n",
		"/metrics": `dispatch_review_queue{reason="escalated"} 0`,
	} {
		resp, err := http.Get(metrics + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s = %d, want %q in:\n%s", path, resp.StatusCode, want, body)
		}
	}
	// The micro service dispatch-web counted the page's two requests.
	var st services.OpsStatus
	for deadline := time.Now().Add(reviewtest.Patience); ; {
		msg, err := m.Srv.NC.Request("$SRV.STATS."+services.OpsName("web"), nil, reviewtest.Patience)
		if err != nil {
			t.Fatal(err)
		}
		var stats micro.Stats
		if err := json.Unmarshal(msg.Data, &stats); err != nil || len(stats.Endpoints) != 1 {
			t.Fatalf("$SRV.STATS.dispatch-web answered %s (%v)", msg.Data, err)
		}
		if err := json.Unmarshal(stats.Endpoints[0].Data, &st); err != nil {
			t.Fatal(err)
		}
		if st.Handled == 2 || time.Now().After(deadline) { // the count follows the answer
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !st.Ready || !st.Running || st.Handled != 2 || st.Errors != 0 || st.InFlight != 0 {
		t.Errorf("dispatch-web stats %+v, want ready, 2 handled", st)
	}
	if err := stop(); err != nil {
		t.Fatalf("dispatch web stopped with %v", err)
	}
}

// waitEnded waits until the outcome stream holds the end of a task of
// taskType (an outcome that settles it).
func waitEnded(t *testing.T, m *reviewtest.Mesh, taskType string) {
	t.Helper()
	stream, err := m.Srv.JS.Stream(t.Context(), trust.OutcomeStream)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing else of taskType runs meanwhile: the end is its last outcome.
	deadline := time.Now().Add(time.Minute)
	for {
		raw, err := stream.GetLastMsgForSubject(t.Context(), trust.OutcomeSubject(taskType))
		var o trust.Outcome
		if err == nil && json.Unmarshal(raw.Data, &o) == nil && o.End {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no end of a %s task stored (%v)", taskType, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
