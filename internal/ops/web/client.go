package web

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
)

// The client HTTP API: submit, status, wait and cancel for clients that
// hold no NATS connection (a web backend, a CI job, Python's urllib, curl).
// OpenAPI: schemas/openapi/api.v1.json.
//
//	POST /api/v1/tasks                 the task (submit.v1): 201 {"id"}; the same id and body again 200 {"id","duplicate":true};
//	                                   the same id with another body 409; an invalid task 400 (api.error.v1)
//	GET  /api/v1/tasks/{id}            the task's state (task_state.v1); 404, or 422 for an id whose submission was rejected
//	GET  /api/v1/tasks/{id}?wait=60s   as dispatch.api.wait: once the task settles, or at the timeout with "timed_out": true (api.wait.reply.v1)
//	POST /api/v1/tasks/{id}/cancel     stop a task that has not ended ({"note": "…"} optional): 200 CancelReply; 409 once it ended otherwise
//
// It is a gateway to intake's request-reply API (dispatch.api.submit,
// status, wait) over the page's NATS connection: intake validates, stores
// and answers; the HTTP status is the answer's code (201/200 on success),
// the body its JSON, an error the same {"error": {code, message,
// problems}} object. Cancel is the review page's cancel
// (review.Client.Cancel), under the client's name.
//
// It requires its own token (ClientAPI.Token), as Authorization: Bearer
// only: no cookie, so a page elsewhere cannot make a browser submit. The
// reviewers' token does not open it, and its token opens nothing of the
// review page or its API.
const clientPrefix = "/api/v1/"

// DefaultMaxClientWaits is ClientAPI.MaxWaits when unset: the HTTP waits
// one web server holds at once. Intake holds 1,024 waits per instance
// (intake.DefaultMaxWaits); a web server in front of one instance holds
// as many.
const DefaultMaxClientWaits = 1024

// maxSubmitBody bounds a submission's body: the largest message NATS
// carries by default. Intake answers anything over events.MaxSubmitBytes
// with 400, as over NATS.
const maxSubmitBody = 1 << 20

// apiPatience is how much longer than a wait's timeout the gateway waits
// for intake's answer, and how long a submit or status may take.
const apiPatience = 10 * time.Second

// ClientAPI configures the client HTTP API.
type ClientAPI struct {
	// NC reaches intake's request-reply API (required).
	NC *nats.Conn
	// Token is required of every request, as Authorization: Bearer
	// (required; never the reviewers' token).
	Token string
	// MaxWaits bounds the waits held at once; past it a wait is answered
	// 503 at once. Default DefaultMaxClientWaits.
	MaxWaits int
}

// CancelReply answers POST /api/v1/tasks/{id}/cancel.
type CancelReply struct {
	ID string `json:"id"`
	// Status is the task's status after the request: cancelled.
	Status events.Status `json:"status"`
	// Already is true when the task had been cancelled before: nothing
	// changed.
	Already bool `json:"already,omitempty"`
}

// clientAPI serves the client HTTP API.
type clientAPI struct {
	cfg    ClientAPI
	review *review.Client
	log    *slog.Logger
	token  [32]byte
	waits  chan struct{} // a place per wait held
	mux    *http.ServeMux
}

func newClientAPI(cfg ClientAPI, rc *review.Client, log *slog.Logger) (*clientAPI, error) {
	if cfg.NC == nil {
		return nil, errors.New("web: the client API needs a NATS connection")
	}
	if cfg.Token == "" {
		return nil, errors.New("web: the client API needs a token of its own")
	}
	if cfg.MaxWaits <= 0 {
		cfg.MaxWaits = DefaultMaxClientWaits
	}
	c := &clientAPI{cfg: cfg, review: rc, log: log, token: sha256.Sum256([]byte(cfg.Token)),
		waits: make(chan struct{}, cfg.MaxWaits), mux: http.NewServeMux()}
	c.mux.HandleFunc("POST /api/v1/tasks", c.submit)
	c.mux.HandleFunc("GET /api/v1/tasks/{id}", c.task)
	c.mux.HandleFunc("POST /api/v1/tasks/{id}/cancel", c.cancel)
	c.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, events.NewAPIError(http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s (POST /api/v1/tasks, GET /api/v1/tasks/{id}[?wait=60s], POST /api/v1/tasks/{id}/cancel)", r.Method, r.URL.Path)))
	})
	return c, nil
}

// ClientWaits is how many waits the client API holds now (0 without it).
func (h *Handler) ClientWaits() int {
	if h.client == nil {
		return 0
	}
	return len(h.client.waits)
}

func (c *clientAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	bearer, ok := bearerToken(r)
	sum := sha256.Sum256([]byte(bearer))
	if !ok || subtle.ConstantTimeCompare(sum[:], c.token[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="dispatch-api"`)
		writeAPIError(w, events.NewAPIError(http.StatusUnauthorized,
			"unauthorized: send Authorization: Bearer <the client token> (DISPATCH_HTTP_CLIENT_TOKEN, or the one `dispatch up` printed); the reviewers' token does not open this API"))
		return
	}
	c.mux.ServeHTTP(w, r)
}

// writeAPIError writes the error object of the NATS API, its code as the
// HTTP status.
func writeAPIError(w http.ResponseWriter, ae *events.APIError) {
	body, _ := json.Marshal(events.ErrorReply{Error: ae})
	writeBody(w, ae.Code, body)
}

func writeBody(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}

func (c *clientAPI) submit(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSubmitBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeAPIError(w, events.NewAPIError(http.StatusRequestEntityTooLarge,
				fmt.Sprintf("the body is over %d bytes; a task is at most %d", maxSubmitBody, events.MaxSubmitBytes)))
			return
		}
		writeAPIError(w, events.NewAPIError(events.CodeBadRequest, "read the body: "+err.Error()))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), apiPatience)
	defer cancel()
	// The client's traceparent goes on to intake: its trace continues.
	req := nats.NewMsg(events.SubmitAPI)
	req.Data = body
	tracing.Inject(tracing.ExtractHTTP(ctx, r.Header), req.Header)
	msg, err := c.cfg.NC.RequestMsgWithContext(ctx, req)
	c.relay(w, r, msg, err, func(data []byte) int {
		var sr events.SubmitReply
		if json.Unmarshal(data, &sr) == nil && sr.ID != "" {
			w.Header().Set("Location", "/api/v1/tasks/"+sr.ID)
			if sr.Duplicate {
				return http.StatusOK
			}
		}
		return http.StatusCreated
	})
}

// task answers GET /api/v1/tasks/{id}: the state, or with ?wait= a wait.
func (c *clientAPI) task(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !r.URL.Query().Has("wait") {
		req, _ := json.Marshal(events.TaskRequest{ID: id})
		ctx, cancel := context.WithTimeout(r.Context(), apiPatience)
		defer cancel()
		msg, err := c.cfg.NC.RequestWithContext(ctx, events.APIStatus, req)
		c.relay(w, r, msg, err, nil)
		return
	}
	c.wait(w, r, id, r.URL.Query().Get("wait"))
}

// wait holds a place (503 at once past MaxWaits) and asks intake's
// dispatch.api.wait, on a reply subject of its own: intake bounds the
// waits of one client (its reply subject without the last token), and
// each HTTP wait is its own client there — this server's MaxWaits is
// what bounds them all.
func (c *clientAPI) wait(w http.ResponseWriter, r *http.Request, id, timeout string) {
	select {
	case c.waits <- struct{}{}:
		defer func() { <-c.waits }()
	default:
		writeAPIError(w, events.NewAPIError(events.CodeUnavailable,
			fmt.Sprintf("busy: %d waits in progress, this web server's limit: ask again", c.cfg.MaxWaits)))
		return
	}
	d, perr := time.ParseDuration(timeout)
	if perr != nil || d <= 0 || d > events.MaxWaitTimeout {
		d = events.DefaultWaitTimeout // intake answers a bad timeout with 400 at once
	}
	// The answer comes after the server's WriteTimeout: this response's
	// deadline is the wait's.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d + 2*apiPatience))
	req, _ := json.Marshal(events.TaskRequest{ID: id, Timeout: timeout})
	inbox := c.cfg.NC.NewInbox() + ".w"
	// One answer comes: a channel of one. (SubscribeSync's channel holds
	// 65,536 messages, 512 KiB of it allocated per wait.)
	answers := make(chan *nats.Msg, 1)
	sub, err := c.cfg.NC.ChanSubscribe(inbox, answers)
	if err != nil {
		c.relay(w, r, nil, err, nil)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.cfg.NC.PublishRequest(events.APIWait, inbox, req); err != nil {
		c.relay(w, r, nil, err, nil)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), d+apiPatience)
	defer cancel()
	var msg *nats.Msg
	err = nil
	select {
	case msg = <-answers:
		if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
			err = nats.ErrNoResponders
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.relay(w, r, msg, err, nil)
}

// relay answers intake's answer msg (or the failure err to get one): an
// error answer with its code as the HTTP status and its body as it is; a
// success with ok(body) (nil: 200) and its body.
func (c *clientAPI) relay(w http.ResponseWriter, r *http.Request, msg *nats.Msg, err error, ok func([]byte) int) {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		writeAPIError(w, events.NewAPIError(events.CodeUnavailable, "no dispatch service answers (is the mesh up? intake serves dispatch.api.*): ask again"))
		return
	case r.Context().Err() != nil:
		return // the client left
	case err != nil:
		c.log.Warn("client API: no answer from intake", "path", r.URL.Path, "err", err)
		writeAPIError(w, events.NewAPIError(events.CodeUnavailable, "the dispatch service did not answer in time: ask again"))
		return
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		n, err := strconv.Atoi(code)
		if err != nil || n < 400 || n > 599 {
			n = http.StatusInternalServerError
		}
		if len(msg.Data) == 0 {
			writeAPIError(w, events.NewAPIError(n, msg.Header.Get(micro.ErrorHeader)))
			return
		}
		writeBody(w, n, msg.Data)
		return
	}
	status := http.StatusOK
	if ok != nil {
		status = ok(msg.Data)
	}
	writeBody(w, status, msg.Data)
}

// cancelRequest is the optional body of a cancel.
type cancelRequest struct {
	Note string `json:"note"`
}

func (c *clientAPI) cancel(w http.ResponseWriter, r *http.Request) {
	var req cancelRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil && len(strings.TrimSpace(string(body))) > 0 {
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		err = dec.Decode(&req)
	}
	if err != nil {
		writeAPIError(w, events.NewAPIError(events.CodeBadRequest, "invalid request: the body is {\"note\": \"…\"} or nothing", err.Error()))
		return
	}
	if c.review == nil {
		writeAPIError(w, events.NewAPIError(events.CodeUnavailable, "cancel is not served here"))
		return
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	d, err := c.review.Cancel(r.Context(), r.PathValue("id"), req.Note, "api@"+host)
	if err != nil {
		code := status(err)
		if code == http.StatusInternalServerError {
			c.log.Error("client API: cancel failed", "path", r.URL.Path, "err", err)
		}
		writeAPIError(w, events.NewAPIError(code, err.Error()))
		return
	}
	reply := CancelReply{ID: r.PathValue("id"), Status: events.StatusCancelled, Already: d.Already}
	if d.Task != nil {
		reply.Status = d.Task.Status
	}
	body, _ = json.Marshal(reply)
	writeBody(w, http.StatusOK, body)
}
