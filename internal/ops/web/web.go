// Package web serves human review over HTTP: a JSON API and a plain
// server-rendered page (html/template, no JavaScript framework) with the
// review queue, resolve / reject / requeue buttons, the trust score per type,
// the task explorer (every task, filtered and paged: review.Client.Tasks)
// and, per task, its payload, why it stopped, what was tried, what the
// model answered, its timeline and a cancel button while it has not ended.
//
//	GET  /                               the review queue, newest first, a page at a time, the held tasks, and trust per type (same query as /api/review)
//	GET  /tasks                          the task explorer: every task, newest first (?q= &id= &type= &status= &subject= &since= &until= &cursor= &limit=);
//	                                     q searches id, type, subject, reason and the latest answer (substring, any case)
//	GET  /tasks/{id}                     one task: payload, why it stopped, attempts and answers, dead ends, timeline
//	POST /tasks/{id}/{action}            form: resolve, reject or requeue with a note, or cancel, then back
//	POST /bulk                           form: one decision with one note on the ticked items (target=ID@N) and, with
//	                                     matching=1, on every other open item of type and reason; a page of what it did per item
//	GET  /events                         server-sent events: a "change" per changed task (?task=ID: that one), from the
//	                                     process's one watch of the task bucket; the pages follow it (static/live.js)
//	GET  /api/review                     one page of the queue (review.Queue; ?reason= &type= &age=24h &all=1 &answered=1 &cursor= &limit=),
//	                                     with the held tasks (held: review.HeldList) on the first page of every reason
//	GET  /api/tasks                      one page of the explorer (review.TaskPage; same query as /tasks)
//	GET  /api/tasks/{id}                 one task (review.Detail)
//	GET  /api/tasks/{id}/timeline        its events from the stream
//	GET  /api/trust                      trust per type with recent outcomes
//	POST /api/tasks/{id}/{action}        JSON {"note": "...", "by": "..."} or a form
//	POST /api/bulk                       JSON review.Bulk: {"action", "targets": [{"id", "seen_decisions"}], "type", "reason", "note", "by"}
//
// With Config.Client, the client HTTP API is served beside them under
// /api/v1/ (submit, state, wait, cancel: client.go), with a token of its
// own and nothing else of the review page.
//
// Every request needs the token (Authorization: Bearer, or ?token= once,
// which sets an HttpOnly cookie for the browser). Neither the Host header
// nor the remote address stands in for it: a reverse proxy on the same host
// connects from 127.0.0.1 and may forward Host: localhost, and a page
// elsewhere may rebind its own name to 127.0.0.1 (DNS rebinding) — it still
// has no token, and the browser keeps the cookie for this site's name only.
// A process without a configured token makes one at start (NewToken) and
// prints the page's address with it; such a server may only listen on a
// loopback address (CheckListen).
package web

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

// Config of the handler.
type Config struct {
	// Review reads the queue and records decisions (required).
	Review *review.Client
	// Token is required on every request (required: New refuses an empty
	// one). DISPATCH_HTTP_TOKEN, or one NewToken made at start.
	Token string
	// Log receives request errors. Default slog.Default().
	Log *slog.Logger
	// Now is the clock of the page's "3m ago". Default time.Now.
	Now func() time.Time
	// Client, when set, serves the client HTTP API under /api/v1/
	// (client.go), with a token of its own.
	Client *ClientAPI
	// Policy and Shadow, when Shadow holds a policy, show the shadow
	// policy on the queue page (templates/shadow.html): its revision and
	// what it sets otherwise than Policy, the policy in force.
	Policy, Shadow *policy.Source
}

// ErrNoToken: New was given no token. The page never serves without one.
var ErrNoToken = errors.New("web: a token is required (NewToken makes one)")

// NewToken is a random token (26 characters, 130 bits, safe in a URL) for a
// process that was given none: it lasts as long as the process.
func NewToken() string { return rand.Text() }

// Cookie names.
const (
	tokenCookie = "dispatch_token"
	byCookie    = "dispatch_by"
)

// Handler serves the API and the page.
type Handler struct {
	cfg     Config
	mux     *http.ServeMux
	handler http.Handler
	token   [32]byte
	client  *clientAPI // nil: no client API
	streams streams
}

// New builds the handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Review == nil {
		return nil, errors.New("web: Review is required")
	}
	if cfg.Token == "" {
		return nil, ErrNoToken
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), token: sha256.Sum256([]byte(cfg.Token)), streams: streams{closing: make(chan struct{})}}
	if cfg.Client != nil {
		if cfg.Client.Token == cfg.Token {
			return nil, errors.New("web: the client API's token must differ from the reviewers' token")
		}
		c, err := newClientAPI(*cfg.Client, cfg.Review, cfg.Log)
		if err != nil {
			return nil, err
		}
		h.client = c
	}
	h.routes()
	// Browsers' cross-site form posts are refused (CSRF): a page elsewhere
	// cannot requeue tasks through a reviewer's browser.
	h.handler = http.NewCrossOriginProtection().Handler(h.auth(h.mux))
	return h, nil
}

func (h *Handler) routes() {
	h.mux.HandleFunc("GET /{$}", h.pageQueue)
	h.mux.HandleFunc("GET /tasks", h.pageTasks)
	h.mux.HandleFunc("GET /tasks/{id}", h.pageTask)
	h.mux.HandleFunc("POST /tasks/{id}/{action}", h.formAction)
	h.mux.HandleFunc("POST /whoami", h.formWhoami)
	h.mux.HandleFunc("POST /bulk", h.formBulk)
	h.mux.HandleFunc("GET /events", h.events)
	h.mux.HandleFunc("GET /static/{name}", h.static)
	h.mux.HandleFunc("GET /api/review", h.apiReview)
	h.mux.HandleFunc("GET /api/tasks", h.apiTasks)
	h.mux.HandleFunc("GET /api/tasks/{id}", h.apiTask)
	h.mux.HandleFunc("GET /api/tasks/{id}/timeline", h.apiTimeline)
	h.mux.HandleFunc("GET /api/trust", h.apiTrust)
	h.mux.HandleFunc("POST /api/tasks/{id}/{action}", h.apiAction)
	h.mux.HandleFunc("POST /api/bulk", h.apiBulk)
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "no-referrer")
	// The client API is apart: its own token, never the reviewers' (nor
	// their cookie), and the reviewers' routes never take its token.
	if h.client != nil && strings.HasPrefix(r.URL.Path, clientPrefix) {
		h.client.ServeHTTP(w, r)
		return
	}
	h.handler.ServeHTTP(w, r)
}

// auth requires the token on every request, whatever its Host header or
// remote address say.
func (h *Handler) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query(); q.Has("token") && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			if !h.valid(q.Get("token")) {
				h.unauthorized(w)
				return
			}
			// Trade the query token for a cookie and drop it from the URL
			// (and so from history and logs). The Host header only makes
			// the cookie stricter (Secure beyond localhost); it grants
			// nothing.
			http.SetCookie(w, &http.Cookie{
				Name: tokenCookie, Value: q.Get("token"), Path: "/", HttpOnly: true,
				SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || !loopbackHost(r.Host),
			})
			q.Del("token")
			// Back to the same page of this site only: "//host/x" must not
			// become a redirect to another host.
			to := "/" + strings.TrimLeft(path.Clean("/"+r.URL.Path), "/")
			if enc := q.Encode(); enc != "" {
				to += "?" + enc
			}
			http.Redirect(w, r, to, http.StatusSeeOther)
			return
		}
		if bearer, ok := bearerToken(r); ok && h.valid(bearer) {
			next.ServeHTTP(w, r)
			return
		}
		if c, err := r.Cookie(tokenCookie); err == nil && h.valid(c.Value) {
			next.ServeHTTP(w, r)
			return
		}
		h.unauthorized(w)
	})
}

func (h *Handler) valid(token string) bool {
	sum := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(sum[:], h.token[:]) == 1
}

func (h *Handler) unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="dispatch"`)
	http.Error(w, "401 unauthorized: open the address with ?token= that `dispatch up` or `dispatch web` printed (or ?token=<DISPATCH_HTTP_TOKEN>), or send Authorization: Bearer <token>", http.StatusUnauthorized)
}

func bearerToken(r *http.Request) (string, bool) {
	const prefix = "Bearer "
	a := r.Header.Get("Authorization")
	if len(a) > len(prefix) && (a[:len(prefix)] == prefix || a[:len(prefix)] == "bearer ") {
		return a[len(prefix):], true
	}
	return "", false
}

// loopbackHost reports whether a Host header names this machine.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// by names the human acting: the request's "by" field, the name the
// browser saved, else web@<remote address>.
func (h *Handler) by(r *http.Request, given string) string {
	if given != "" {
		return given
	}
	if c, err := r.Cookie(byCookie); err == nil {
		if v, err := url.QueryUnescape(c.Value); err == nil && v != "" {
			return v
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "web@" + host
}

// status maps review errors to HTTP statuses.
func status(err error) int {
	switch {
	case errors.Is(err, review.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, review.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, review.ErrNotReviewable), errors.Is(err, review.ErrNoTask), errors.Is(err, review.ErrEnded):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}
