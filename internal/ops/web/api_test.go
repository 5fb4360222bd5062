package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

var bg = context.Background()

// seeded is a provisioned stream holding hand-written tasks and review
// records, no services running, and the web handler on an httptest server.
type seeded struct {
	t     *testing.T
	srv   *natstest.Server
	tasks *services.TaskStore
	http  *httptest.Server
	rc    *review.Client
	h     *web.Handler
}

const evil = `<script>alert("x")</script>`

// token is the page's token in these tests.
const token = "s3cret"

func newSeeded(t *testing.T) *seeded {
	t.Helper()
	srv := natstest.Start(t)
	stores, err := services.Provision(bg, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s := &seeded{t: t, srv: srv, tasks: services.NewTaskStore(stores.Tasks)}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rc, err := review.New(review.Config{JS: srv.JS, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close) // before the server stops
	h, err := web.New(web.Config{Review: rc, Token: token, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s.http, s.rc, s.h = httptest.NewServer(h), rc, h
	t.Cleanup(func() { h.Shutdown(); s.http.Close() })

	// blk-1: escalated after two attempts; gtd-1: gated; run-1: running.
	// Their type's outcomes, published to the outcome stream as the
	// recorder publishes them.
	for i, ok := range []bool{false, true, false} {
		msg, err := trust.OutcomeMsg("css_fix", trust.Outcome{Key: "o" + string(rune('0'+i)), Success: ok, At: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.JS.PublishMsg(bg, msg); err != nil {
			t.Fatal(err)
		}
	}
	s.task("blk-1", events.StatusBlocked, "HANDOFF after 2 attempts; last error: "+evil, events.ReviewEscalated,
		[]events.AttemptRecord{
			{Attempt: 1, Pass: 1, Rung: "REFINE", Approach: "null check in handleResponse()", Outcome: "failure", Reason: "wrong location", TokensIn: 100, TokensOut: 50, Cost: 0.01},
			{Attempt: 2, Pass: 2, Rung: "REFINE", Approach: evil, Outcome: "failure", Reason: "still broken", TokensIn: 120, TokensOut: 60, Cost: 0.02},
		})
	s.task("gtd-1", events.StatusNeedsHumanReview, "Blocked: css_fix trust score 0.08 below 0.15", events.ReviewGated, nil)
	s.task("run-1", events.StatusRunning, "", "", nil)
	return s
}

// task writes a task's state, its queued event and (with reason) its review record.
func (s *seeded) task(id string, status events.Status, why, reason string, history []events.AttemptRecord) {
	s.t.Helper()
	task := events.Task{ID: id, Type: "css_fix", Subject: "src/" + id + ".css", Payload: json.RawMessage(`{"issue":"x"}`)}
	pass := max(1, len(history))
	st := events.TaskState{ID: id, Type: task.Type, Subject: task.Subject, Status: status, Pass: pass, Attempts: len(history),
		Reason: why, History: history, LastError: "still broken"}
	if _, err := s.tasks.Update(bg, id, func(cur *events.TaskState, _ bool) error { *cur = st; return nil }); err != nil {
		s.t.Fatal(err)
	}
	s.publish(events.IndexSubject(task.Type, task.Subject), events.EventIndexed, "intake@test", "", events.IndexEntry{ID: id, Type: task.Type, Subject: task.Subject, SubmittedAt: time.Now()})
	s.publish(events.TaskSubject(id, events.StageQueued), events.EventQueued, "intake@test", "", events.Queued{Base: events.Base{Task: task, Run: events.Run{Pass: 1, Attempt: 1}}})
	if reason != "" {
		s.publish(events.ReviewSubject(reason, id), "review."+reason+".v1", "recorder@test", why,
			events.Escalated{Base: events.Base{Task: task, Run: events.Run{Pass: pass, Attempt: pass}}, Reason: why})
	}
}

// state reads a task's state.
func (s *seeded) state(id string) events.TaskState {
	s.t.Helper()
	st, err := s.tasks.Get(bg, id)
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

func (s *seeded) publish(subject, event, by, why string, v any) {
	s.t.Helper()
	msg := nats.NewMsg(subject)
	msg.Header.Set(events.HeaderEvent, event)
	msg.Header.Set(events.HeaderService, by)
	if why != "" {
		msg.Header.Set(events.HeaderError, why)
	}
	msg.Data, _ = json.Marshal(v)
	if _, err := s.srv.JS.PublishMsg(bg, msg); err != nil {
		s.t.Fatal(err)
	}
}

// do sends a request and returns the status and body.
func (s *seeded) do(method, path, contentType, body string, header ...string) (int, string) {
	s.t.Helper()
	resp := s.send(method, path, contentType, body, header...)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// send sends a request, not following redirects, with the token as a
// bearer unless header names Authorization or Cookie (an empty value sends
// none of it).
func (s *seeded) send(method, path, contentType, body string, header ...string) *http.Response {
	s.t.Helper()
	req, err := http.NewRequest(method, s.http.URL+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	bearer := true
	for i := 0; i+1 < len(header); i += 2 {
		switch header[i] {
		case "Host":
			req.Host = header[i+1]
			continue
		case "Authorization", "Cookie":
			bearer = false
		}
		if header[i+1] != "" {
			req.Header.Set(header[i], header[i+1])
		}
	}
	if bearer {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp
}

func decode[T any](t *testing.T, body string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return v
}

func TestAPIReview(t *testing.T) {
	s := newSeeded(t)
	code, body := s.do("GET", "/api/review", "", "")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	q := decode[review.Queue](t, body)
	if len(q.Items) != 2 || q.Open["escalated"] != 1 || q.Open["gated"] != 1 || q.Open["poison"] != 0 || q.Retention.MaxAge != 30*24*time.Hour ||
		q.Items[0].Key != "gtd-1" || q.Scanned != 2 || q.Next != "" {
		t.Fatalf("queue = %+v", q)
	}
	code, body = s.do("GET", "/api/review?reason=gated&type=css_fix&age=1h", "", "")
	if q := decode[review.Queue](t, body); code != 200 || len(q.Items) != 1 || q.Items[0].Key != "gtd-1" || q.Items[0].Status != events.StatusNeedsHumanReview {
		t.Fatalf("%d %+v", code, q.Items)
	}
	for _, bad := range []string{"?age=yesterday", "?all=maybe", "?reason=Not+A+Reason", "?limit=x", "?limit=501", "?cursor=!!"} {
		if code, body := s.do("GET", "/api/review"+bad, "", ""); code != 400 || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s", bad, code, body)
		}
	}
}

func TestAPITaskAndTimeline(t *testing.T) {
	s := newSeeded(t)
	code, body := s.do("GET", "/api/tasks/blk-1", "", "")
	d := decode[review.Detail](t, body)
	if code != 200 || d.Task == nil || d.Task.Status != events.StatusBlocked || len(d.Attempts) != 2 || !d.Actionable ||
		d.Trust == nil || d.Trust.Outcomes != 3 || len(d.Records) != 1 || !strings.HasPrefix(d.Why, "blocked: HANDOFF") {
		t.Fatalf("%d %+v", code, d)
	}
	if code, body := s.do("GET", "/api/tasks/nope", "", ""); code != 404 {
		t.Errorf("unknown task: %d %s", code, body)
	}
	if code, body := s.do("GET", "/api/tasks/a.b", "", ""); code != 400 {
		t.Errorf("invalid id: %d %s", code, body)
	}

	code, body = s.do("GET", "/api/tasks/blk-1/timeline", "", "")
	rows := decode[[]review.AuditEntry](t, body)
	if code != 200 || len(rows) != 2 || rows[0].Stage != "queued" || rows[0].Who != "intake@test" || rows[1].Stage != "review.escalated" || rows[1].Summary == "" {
		t.Fatalf("%d %+v", code, rows)
	}
	if code, _ := s.do("GET", "/api/tasks/nope/timeline", "", ""); code != 404 {
		t.Errorf("timeline of an unknown task: %d", code)
	}
}

func TestAPITrust(t *testing.T) {
	s := newSeeded(t)
	code, body := s.do("GET", "/api/trust", "", "")
	all := decode[[]review.TrustView](t, body)
	if code != 200 || len(all) != 1 || all[0].Type != "css_fix" || all[0].Outcomes != 3 || len(all[0].Recent) != 3 || all[0].Gated {
		t.Fatalf("%d %+v", code, all)
	}
}

func TestAPIActions(t *testing.T) {
	s := newSeeded(t)
	code, body := s.do("POST", "/api/tasks/blk-1/resolve", "application/json", `{"note":"fixed by hand","by":"alice"}`)
	dec := decode[review.Decision](t, body)
	if code != 200 || dec.Task == nil || dec.Task.Status != events.StatusSucceeded || dec.Action.By != "alice" {
		t.Fatalf("resolve: %d %s", code, body)
	}
	if code, body := s.do("POST", "/api/tasks/blk-1/reject", "application/json", `{"note":"again"}`); code != 409 || !strings.Contains(body, "already succeeded") {
		t.Errorf("second action: %d %s", code, body)
	}
	// A form body works too; without "by" the actor is web@<address>.
	code, body = s.do("POST", "/api/tasks/gtd-1/requeue", "application/x-www-form-urlencoded", url.Values{"note": {"go ahead"}}.Encode())
	dec = decode[review.Decision](t, body)
	if code != 200 || dec.Task.Status != events.StatusPending || !strings.HasPrefix(dec.Action.By, "web@127.0.0.1") {
		t.Fatalf("requeue: %d %s", code, body)
	}
	for _, c := range []struct {
		method, path, ct, body string
		code                   int
	}{
		{"POST", "/api/tasks/run-1/requeue", "application/json", `{"note":"x"}`, 409},
		{"POST", "/api/tasks/nope/resolve", "application/json", `{"note":"x"}`, 404},
		{"POST", "/api/tasks/blk-1/explode", "application/json", `{"note":"x"}`, 400},
		{"POST", "/api/tasks/gtd-1/reject", "application/json", `{"note":""}`, 400},
		{"POST", "/api/tasks/gtd-1/reject", "application/json", `{"note":"x","colour":"red"}`, 400},
		{"POST", "/api/tasks/gtd-1/reject", "application/json", `{"note":`, 400},
		{"POST", "/api/tasks/gtd-1/reject", "application/json", `{"note":"` + strings.Repeat("x", 70<<10) + `"}`, 400},
		{"GET", "/api/tasks/gtd-1/reject", "", "", 405},
		// decided since: blk-1 was resolved (one decision) after a page that saw none
		{"POST", "/api/tasks/blk-1/requeue", "application/json", `{"note":"x","seen_decisions":0}`, 409},
		{"POST", "/api/tasks/blk-1/requeue", "application/x-www-form-urlencoded", url.Values{"note": {"x"}, "seen_decisions": {"0"}}.Encode(), 409},
		{"POST", "/api/tasks/blk-1/requeue", "application/x-www-form-urlencoded", url.Values{"note": {"x"}, "seen_decisions": {"many"}}.Encode(), 400},
	} {
		if code, body := s.do(c.method, c.path, c.ct, c.body); code != c.code {
			t.Errorf("%s %s %.40s: %d %.200s, want %d", c.method, c.path, c.body, code, body, c.code)
		}
	}
}

func TestPagesEscapeAndAct(t *testing.T) {
	s := newSeeded(t)
	code, body := s.do("GET", "/", "", "")
	if code != 200 || !strings.Contains(body, "blk-1") || !strings.Contains(body, "gtd-1") || !strings.Contains(body, "keeps records for 30d") {
		t.Fatalf("queue page: %d %s", code, body)
	}
	if strings.Contains(body, evil) || !strings.Contains(body, "&lt;script&gt;") {
		t.Fatal("the queue page does not escape what a model wrote")
	}
	code, body = s.do("GET", "/tasks/blk-1", "", "")
	if code != 200 || !strings.Contains(body, "null check in handleResponse()") || !strings.Contains(body, "Why it stopped") || strings.Contains(body, evil) {
		t.Fatalf("task page: %d %s", code, body)
	}
	if !strings.Contains(body, `name="seen_decisions" value="0"`) {
		t.Error("the task page's decision form does not say what it saw (seen_decisions)")
	}
	if code, _ := s.do("GET", "/tasks/nope", "", ""); code != 404 {
		t.Errorf("page of an unknown task: %d", code)
	}

	// The page's form posts, then goes back with a flash message.
	form := url.Values{"note": {"try parsePayload()"}, "back": {"/"}}.Encode()
	code, _ = s.do("POST", "/tasks/gtd-1/requeue", "application/x-www-form-urlencoded", form)
	if code != http.StatusSeeOther {
		t.Fatalf("form post: %d", code)
	}
	resp := s.send("POST", "/tasks/run-1/requeue", "application/x-www-form-urlencoded", url.Values{"note": {"x"}, "back": {"//evil.example/"}}.Encode())
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); !strings.HasPrefix(loc, "/tasks/run-1?err=") {
		t.Errorf("redirect after a refused action = %q", loc)
	}
}

// Nothing but the token opens the page: not a loopback Host header (a
// reverse proxy on this host may forward Host: localhost), not the loopback
// address every request of this test comes from, not forwarding headers.
func TestNeverTrustsHostOrAddress(t *testing.T) {
	if _, err := web.New(web.Config{Review: &review.Client{}}); !errors.Is(err, web.ErrNoToken) {
		t.Fatalf("New without a token: %v, want ErrNoToken", err)
	}
	s := newSeeded(t)
	for _, host := range []string{"localhost", "localhost:8080", "127.0.0.1:8080", "[::1]:8080", "dispatch.example.com"} {
		for _, path := range []string{"/", "/api/review", "/tasks/blk-1"} {
			if code, _ := s.do("GET", path, "", "", "Host", host, "Authorization", "", "X-Forwarded-For", "127.0.0.1", "X-Real-IP", "127.0.0.1"); code != http.StatusUnauthorized {
				t.Errorf("GET %s, Host %s, no token: %d, want 401", path, host, code)
			}
		}
		if code, _ := s.do("POST", "/api/tasks/gtd-1/reject", "application/json", `{"note":"x"}`, "Host", host, "Authorization", ""); code != http.StatusUnauthorized {
			t.Errorf("POST, Host %s, no token: %d, want 401", host, code)
		}
	}
	// The token itself works whatever the Host.
	if code, _ := s.do("GET", "/api/review", "", "", "Host", "dispatch.example.com"); code != http.StatusOK {
		t.Errorf("with the token, Host dispatch.example.com: %d", code)
	}
	// A form posted from another site through the reviewer's browser (its
	// cookie and all) is refused.
	if code, _ := s.do("POST", "/tasks/gtd-1/reject", "application/x-www-form-urlencoded", "note=x", "Cookie", "dispatch_token="+token, "Sec-Fetch-Site", "cross-site"); code != http.StatusForbidden {
		t.Errorf("cross-site post: %d, want 403", code)
	}
}

func TestTokenIsRequired(t *testing.T) {
	s := newSeeded(t)
	none := []string{"Authorization", ""}
	for _, path := range []string{"/", "/api/review", "/api/tasks/blk-1", "/tasks/blk-1", "/api/trust"} {
		if code, _ := s.do("GET", path, "", "", none...); code != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", path, code)
		}
	}
	if code, _ := s.do("POST", "/api/tasks/blk-1/resolve", "application/json", `{"note":"x"}`, none...); code != http.StatusUnauthorized {
		t.Errorf("POST without the token: %d", code)
	}
	if code, _ := s.do("GET", "/api/review", "", "", "Authorization", "Bearer wrong"); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", code)
	}
	if code, _ := s.do("GET", "/api/review", "", "", "Authorization", "Bearer "+token); code != 200 {
		t.Errorf("bearer token: %d", code)
	}
	if code, _ := s.do("GET", "/?token=wrong", "", "", none...); code != http.StatusUnauthorized {
		t.Errorf("wrong query token: %d", code)
	}

	// ?token= sets an HttpOnly cookie and leaves the token out of the URL.
	resp := s.send("GET", "/tasks/blk-1?token="+token, "", "", none...)
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "dispatch_token" {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/tasks/blk-1" || cookie == nil || !cookie.HttpOnly {
		t.Fatalf("token exchange: %d location %q cookie %+v", resp.StatusCode, resp.Header.Get("Location"), cookie)
	}
	if code, _ := s.do("GET", "/tasks/blk-1", "", "", "Cookie", "dispatch_token="+token); code != 200 {
		t.Errorf("with the cookie: %d", code)
	}
	if code, _ := s.do("GET", "/tasks/blk-1", "", "", "Cookie", "dispatch_token=wrong"); code != http.StatusUnauthorized {
		t.Errorf("with a wrong cookie: %d", code)
	}
}

func TestNewToken(t *testing.T) {
	a, b := web.NewToken(), web.NewToken()
	if len(a) < 26 || a == b || url.QueryEscape(a) != a {
		t.Fatalf("NewToken: %q, %q: want two different URL-safe tokens of 26 characters or more", a, b)
	}
}

func TestListenRefusesNonLocalWithoutToken(t *testing.T) {
	for _, c := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:0", "", true},
		{"localhost:0", "", true},
		{"[::1]:0", "", true},
		{"0.0.0.0:0", "", false},
		{":0", "", false},
		{"[::]:0", "", false},
		{"192.0.2.10:8080", "", false},
		{"dispatch.example.com:8080", "", false},
		{"0.0.0.0:0", "s3cret", true},
		{"nonsense", "", false},
	} {
		err := web.CheckListen(c.addr, c.token)
		if (err == nil) != c.ok {
			t.Errorf("CheckListen(%q, %q) = %v", c.addr, c.token, err)
		}
		if !c.ok && c.addr != "nonsense" && !errors.Is(err, web.ErrTokenRequired) {
			t.Errorf("CheckListen(%q): %v is not ErrTokenRequired", c.addr, err)
		}
	}
	if _, err := web.Listen("0.0.0.0:0", ""); !errors.Is(err, web.ErrTokenRequired) || !strings.Contains(err.Error(), "DISPATCH_HTTP_TOKEN") {
		t.Fatalf("Listen beyond localhost without a token: %v", err)
	}
	ln, err := web.Listen("0.0.0.0:0", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}
