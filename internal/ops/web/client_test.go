package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// clientToken is the client API's token in these tests.
const clientToken = "client-s3cret"

// patience bounds every wait: a deadlock guard, not a timing assertion.
const patience = 2 * time.Minute

// apiMesh is a whole mesh (simulated model) on an embedded NATS server,
// and the web handler with the client API on an httptest server.
type apiMesh struct {
	t       testing.TB
	srv     *natstest.Server
	tasks   *services.TaskStore
	http    *httptest.Server
	handler *web.Handler
}

// newAPIMesh runs the named services of the mesh (default all).
func newAPIMesh(t testing.TB, maxWaits int, only ...string) *apiMesh {
	t.Helper()
	srv := natstest.Start(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- mesh.Run(ctx, mesh.Options{NC: srv.NC, JS: srv.JS, Provision: true, Log: quiet, Services: only})
	}()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(patience)
	for {
		if _, err := srv.NC.Request("$SRV.PING."+services.MicroService, nil, time.Second); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("mesh stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the mesh's API never answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	kv, err := srv.JS.KeyValue(bg, services.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := review.New(review.Config{JS: srv.JS, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	h, err := web.New(web.Config{Review: rc, Token: token, Log: quiet,
		Client: &web.ClientAPI{NC: srv.NC, Token: clientToken, MaxWaits: maxWaits}})
	if err != nil {
		t.Fatal(err)
	}
	m := &apiMesh{t: t, srv: srv, tasks: services.NewTaskStore(kv), http: httptest.NewServer(h), handler: h}
	t.Cleanup(m.http.Close)
	return m
}

// do sends a request with the bearer token (none when ""), and returns
// the status and body.
func (m *apiMesh) do(ctx context.Context, method, path, bearer, body string) (int, []byte) {
	m.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, m.http.URL+path, strings.NewReader(body))
	if err != nil {
		m.t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil
		}
		m.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil && ctx.Err() == nil {
		m.t.Fatal(err)
	}
	return resp.StatusCode, b
}

func (m *apiMesh) call(method, path, body string) (int, []byte) {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(bg, patience)
	defer cancel()
	return m.do(ctx, method, path, clientToken, body)
}

// apiErr decodes the NATS API's error object (unknown fields refused),
// its code the HTTP status.
func apiErr(t *testing.T, code int, got int, body []byte) *events.APIError {
	t.Helper()
	var r events.ErrorReply
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil || r.Error == nil || got != code || r.Error.Code != code || r.Error.Problems == nil {
		t.Fatalf("answer %d %s, want the error object with code %d (%v)", got, body, code, err)
	}
	return r.Error
}

func decodeAs[T any](t *testing.T, code int, want int, body []byte) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if code != want || dec.Decode(&v) != nil {
		t.Fatalf("answer %d %s, want %d and a %T", code, body, want, v)
	}
	return v
}

// The client API: submit (201, 200 for the same id and body, 409 naming
// what differs, 400 with the NATS API's error object), state, wait until
// settled, 404 and 422 for ids without a task, 400 for a bad wait.
func TestClientAPISubmitWaitStatus(t *testing.T) {
	m := newAPIMesh(t, 0)
	task := `{"id":"http-1","type":"css_fix","subject":"src/app.css","payload":{"issue":"button misaligned"}}`
	code, body := m.call("POST", "/api/v1/tasks", task)
	if sr := decodeAs[events.SubmitReply](t, code, http.StatusCreated, body); sr.ID != "http-1" || sr.Duplicate {
		t.Fatalf("submit: %s", body)
	}
	code, body = m.call("GET", "/api/v1/tasks/http-1?wait=60s", "")
	wr := decodeAs[events.WaitReply](t, code, http.StatusOK, body)
	if wr.Status != events.StatusSucceeded || !wr.Terminal || wr.TimedOut || wr.Result == nil {
		t.Fatalf("wait: %s", body)
	}
	code, body = m.call("GET", "/api/v1/tasks/http-1", "")
	if st := decodeAs[events.TaskState](t, code, http.StatusOK, body); st.ID != "http-1" || st.Status != events.StatusSucceeded {
		t.Fatalf("status: %s", body)
	}

	// The same id and body (keys reordered): 200, a duplicate.
	code, body = m.call("POST", "/api/v1/tasks", `{"payload":{"issue":"button misaligned"},"subject":"src/app.css","type":"css_fix","id":"http-1"}`)
	if sr := decodeAs[events.SubmitReply](t, code, http.StatusOK, body); sr.ID != "http-1" || !sr.Duplicate {
		t.Fatalf("same body again: %s", body)
	}
	// Another body: 409, naming what differs.
	code, body = m.call("POST", "/api/v1/tasks", `{"id":"http-1","type":"css_fix","subject":"src/app.css","payload":{"issue":"header misaligned"}}`)
	if ae := apiErr(t, events.CodeConflict, code, body); !slices.Equal(ae.Problems, []string{`"payload" differs at .issue`}) {
		t.Fatalf("another body: %s", body)
	}
	// An invalid task: 400, every problem, as over NATS.
	code, body = m.call("POST", "/api/v1/tasks", `{"id":"bad-1","type":"css_fix","max_retries":-1}`)
	if ae := apiErr(t, events.CodeBadRequest, code, body); !slices.Equal(ae.Problems, []string{`"subject" is required`, `"max_retries" must not be negative`}) {
		t.Fatalf("invalid task: %s", body)
	}
	code, body = m.call("POST", "/api/v1/tasks", `not json`)
	apiErr(t, events.CodeBadRequest, code, body)
	// Its id: 422, the rejection and why (once intake kept it).
	code, body = m.call("GET", "/api/v1/tasks/bad-1", "")
	if ae := apiErr(t, events.CodeRejected, code, body); !slices.Contains(ae.Problems, `"subject" is required`) {
		t.Fatalf("status of a rejected id: %s", body)
	}
	code, body = m.call("GET", "/api/v1/tasks/nobody", "")
	apiErr(t, events.CodeNotFound, code, body)
	code, body = m.call("GET", "/api/v1/tasks/nobody?wait=forever", "")
	apiErr(t, events.CodeBadRequest, code, body)
	code, body = m.call("GET", "/api/v1/tasks/no%20such?wait=1s", "")
	apiErr(t, events.CodeBadRequest, code, body)
}

// Cancel stops a task that has not ended (again: already), and refuses
// one that ended otherwise (409).
func TestClientAPICancel(t *testing.T) {
	m := newAPIMesh(t, 0)
	t0 := time.Now().UTC()
	tk := events.Task{ID: "pend-1", Type: "css_fix", Subject: "src/app.css", SubmittedAt: t0}
	if _, _, err := m.tasks.Create(bg, task.Queued(tk, events.Run{Pass: 1}, 0)); err != nil {
		t.Fatal(err)
	}
	code, body := m.call("POST", "/api/v1/tasks/pend-1/cancel", `{"note":"not needed"}`)
	if r := decodeAs[web.CancelReply](t, code, http.StatusOK, body); r.Status != events.StatusCancelled || r.Already {
		t.Fatalf("cancel: %s", body)
	}
	code, body = m.call("POST", "/api/v1/tasks/pend-1/cancel", "")
	if r := decodeAs[web.CancelReply](t, code, http.StatusOK, body); !r.Already {
		t.Fatalf("cancel again: %s", body)
	}
	code, body = m.call("GET", "/api/v1/tasks/pend-1?wait=60s", "")
	if wr := decodeAs[events.WaitReply](t, code, http.StatusOK, body); wr.Status != events.StatusCancelled {
		t.Fatalf("wait of a cancelled task: %s", body)
	}
	code, body = m.call("POST", "/api/v1/tasks", `{"id":"done-1","type":"css_fix","subject":"a.css"}`)
	decodeAs[events.SubmitReply](t, code, http.StatusCreated, body)
	m.call("GET", "/api/v1/tasks/done-1?wait=60s", "")
	code, body = m.call("POST", "/api/v1/tasks/done-1/cancel", "")
	apiErr(t, http.StatusConflict, code, body)
	code, body = m.call("POST", "/api/v1/tasks/nobody/cancel", "")
	apiErr(t, events.CodeNotFound, code, body)
	code, body = m.call("POST", "/api/v1/tasks/pend-1/cancel", `{"by":"me"}`)
	apiErr(t, events.CodeBadRequest, code, body)
}

// Two tokens, two doors: the client token opens the client API and
// nothing of the review page or its API; the reviewers' token (or their
// cookie) does not open the client API.
func TestClientAPITokens(t *testing.T) {
	m := newAPIMesh(t, 0)
	ctx, cancel := context.WithTimeout(bg, patience)
	defer cancel()
	submit := `{"type":"css_fix","subject":"a.css"}`
	for _, c := range []struct{ method, path, bearer, body string }{
		{"POST", "/api/v1/tasks", "", submit},
		{"POST", "/api/v1/tasks", token, submit},
		{"GET", "/api/v1/tasks/x", token, ""},
		{"POST", "/api/v1/tasks/x/cancel", token, ""},
	} {
		code, body := m.do(ctx, c.method, c.path, c.bearer, c.body)
		apiErr(t, http.StatusUnauthorized, code, body)
	}
	// The reviewers' cookie does not open it either.
	req, _ := http.NewRequestWithContext(ctx, "POST", m.http.URL+"/api/v1/tasks", strings.NewReader(submit))
	req.AddCookie(&http.Cookie{Name: "dispatch_token", Value: token})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the reviewers' cookie on the client API: %d", resp.StatusCode)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/"}, {"GET", "/tasks"}, {"GET", "/api/review"}, {"GET", "/api/tasks"}, {"GET", "/api/trust"},
		{"POST", "/api/tasks/x/requeue"}, {"POST", "/api/tasks/x/cancel"}, {"POST", "/tasks/x/resolve"},
		{"GET", "/?token=" + clientToken},
	} {
		if code, body := m.do(ctx, c.method, c.path, clientToken, `{"note":"x"}`); code != http.StatusUnauthorized {
			t.Errorf("%s %s with the client token: %d %s, want 401", c.method, c.path, code, body)
		}
	}
	if _, err := web.New(web.Config{Review: &review.Client{}, Token: "same", Client: &web.ClientAPI{NC: m.srv.NC, Token: "same"}}); err == nil {
		t.Error("one token for both: accepted")
	}
}

// Past MaxWaits a wait is answered 503 at once, with the error object;
// the waits held go on.
func TestClientAPIWaitBound(t *testing.T) {
	m := newAPIMesh(t, 2)
	ctx, cancel := context.WithCancel(bg)
	ended := make(chan string, 2)
	var held sync.WaitGroup
	for _, id := range []string{"never-a", "never-b"} {
		held.Add(1)
		go func() {
			defer held.Done()
			// Refused while the probe below holds a place: ask again.
			for ctx.Err() == nil {
				req, err := http.NewRequestWithContext(ctx, "GET", m.http.URL+"/api/v1/tasks/"+id+"?wait=10m", nil)
				if err != nil {
					ended <- err.Error()
					return
				}
				req.Header.Set("Authorization", "Bearer "+clientToken)
				resp, err := http.DefaultClient.Do(req) // held until cancel
				if err != nil {
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable {
					continue
				}
				if ctx.Err() == nil {
					ended <- fmt.Sprintf("%s ended before it was cancelled: %d %s", id, resp.StatusCode, b)
				}
				return
			}
		}()
	}
	defer func() { cancel(); held.Wait() }()
	// Until both hold their place, a third is served (404 after 1s) — or,
	// holding one itself, makes one of them ask again.
	deadline := time.Now().Add(patience)
	for {
		code, body := m.call("GET", "/api/v1/tasks/third?wait=1s", "")
		if code == http.StatusServiceUnavailable {
			if ae := apiErr(t, events.CodeUnavailable, code, body); !strings.Contains(ae.Message, "busy: 2 waits in progress") {
				t.Fatalf("past the bound: %s", body)
			}
			break
		}
		apiErr(t, events.CodeNotFound, code, body)
		select {
		case e := <-ended:
			t.Fatal(e)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("a third wait was never refused")
		}
	}
	// A status is not a wait: still served.
	code, body := m.call("GET", "/api/v1/tasks/third", "")
	apiErr(t, events.CodeNotFound, code, body)
}

// With no intake running, every request is answered 503 with the error
// object, saying so, at once (NATS's no-responders), waits included.
func TestClientAPINoService(t *testing.T) {
	srv := natstest.Start(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := services.Provision(bg, srv.JS, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	rc, err := review.New(review.Config{JS: srv.JS, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	h, err := web.New(web.Config{Review: rc, Token: token, Log: quiet, Client: &web.ClientAPI{NC: srv.NC, Token: clientToken}})
	if err != nil {
		t.Fatal(err)
	}
	m := &apiMesh{t: t, srv: srv, http: httptest.NewServer(h), handler: h}
	t.Cleanup(m.http.Close)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/v1/tasks", `{"type":"css_fix","subject":"a.css"}`},
		{"GET", "/api/v1/tasks/x", ""},
		{"GET", "/api/v1/tasks/x?wait=10m", ""},
	} {
		code, body := m.call(c.method, c.path, c.body)
		if ae := apiErr(t, events.CodeUnavailable, code, body); !strings.Contains(ae.Message, "no dispatch service answers") {
			t.Errorf("%s %s: %s", c.method, c.path, body)
		}
	}
}

// A submission over HTTP with a traceparent header is queued carrying it:
// intake's span continues the client's trace.
func TestClientAPISubmitCarriesTraceparent(t *testing.T) {
	m := newAPIMesh(t, 0, mesh.Intake)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx, cancel := context.WithTimeout(bg, patience)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", m.http.URL+"/api/v1/tasks",
		strings.NewReader(`{"id":"traced-1","type":"css_fix","subject":"src/app.css"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+clientToken)
	req.Header.Set("Traceparent", tp)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("submit: %d", resp.StatusCode)
	}
	s, err := m.srv.JS.Stream(ctx, services.SubmitStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetLastMsgForSubject(ctx, events.SubmitSubject("css_fix"))
	if err != nil {
		t.Fatal(err)
	}
	if got := raw.Header.Get("traceparent"); got != tp {
		t.Errorf("queued submission's traceparent %q, want the client's %q", got, tp)
	}
}
