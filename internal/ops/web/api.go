package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

// maxBody bounds an action request.
const maxBody = 64 << 10

// ActionRequest is the body of POST /api/tasks/{id}/{action}.
type ActionRequest struct {
	Note string `json:"note"`
	// By names who acts; default: the saved name, else web@<address>.
	By string `json:"by,omitempty"`
	// SeenDecisions, when set, is how many human decisions the task held
	// when the decider looked (the length of task.actions, an item's
	// decisions): a resolve, reject or requeue is refused (409) when
	// another was taken since.
	SeenDecisions *int `json:"seen_decisions,omitempty"`
}

// apiError is the body of every API error.
type apiError struct {
	Error string `json:"error"`
}

func (h *Handler) writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		h.cfg.Log.Warn("web: write response", "err", err)
	}
}

func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code := status(err)
	if code == http.StatusInternalServerError {
		h.cfg.Log.Error("web: request failed", "path", r.URL.Path, "err", err)
	}
	h.writeJSON(w, code, apiError{Error: err.Error()})
}

// filter reads a review filter from the query: reason, type, age, all,
// answered, cursor, limit.
func filter(r *http.Request) (review.Filter, error) {
	q := r.URL.Query()
	f := review.Filter{Reason: q.Get("reason"), Type: strings.TrimSpace(q.Get("type")), Cursor: q.Get("cursor")}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil {
			return f, fmt.Errorf("%w: limit %q is not a number", review.ErrInvalid, l)
		}
		f.Limit = n
	}
	if a := q.Get("age"); a != "" {
		d, err := time.ParseDuration(a)
		if err != nil {
			return f, fmt.Errorf("%w: age %q is not a duration like 24h", review.ErrInvalid, a)
		}
		f.Age = d
	}
	if a := q.Get("all"); a != "" {
		all, err := strconv.ParseBool(a)
		if err != nil {
			return f, fmt.Errorf("%w: all %q is not a boolean", review.ErrInvalid, a)
		}
		f.All = all
	}
	if a := q.Get("answered"); a != "" {
		answered, err := strconv.ParseBool(a)
		if err != nil {
			return f, fmt.Errorf("%w: answered %q is not a boolean", review.ErrInvalid, a)
		}
		f.Answered = answered
	}
	return f, f.Validate()
}

func (h *Handler) apiReview(w http.ResponseWriter, r *http.Request) {
	f, err := filter(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	q, err := h.cfg.Review.List(r.Context(), f)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	q.Open = h.openCounts(r)
	q.Held = h.held(r, f)
	h.writeJSON(w, http.StatusOK, q)
}

// held reads the tasks the gate holds for trust (review.Client.Held, of
// the filter's type) for a page that lists them (Filter.ListsHeld); nil
// when it does not, or, logged, when they cannot be read: the page of
// items does not depend on them.
func (h *Handler) held(r *http.Request, f review.Filter) *review.HeldList {
	if !f.ListsHeld() {
		return nil
	}
	hl, err := h.cfg.Review.Held(r.Context(), f.Type)
	if err != nil {
		h.cfg.Log.Warn("web: held tasks", "err", err)
		return nil
	}
	return &hl
}

// openCounts reads the open items per reason of the whole queue
// (review.Client.OpenCounts: what is new since the last reading); nil,
// logged, when it cannot: the page of items does not depend on it.
func (h *Handler) openCounts(r *http.Request) map[string]int {
	open, err := h.cfg.Review.OpenCounts(r.Context())
	if err != nil {
		h.cfg.Log.Warn("web: review queue counts", "err", err)
		return nil
	}
	return open
}

func (h *Handler) apiTask(w http.ResponseWriter, r *http.Request) {
	d, err := h.cfg.Review.Show(r.Context(), r.PathValue("id"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeJSON(w, http.StatusOK, d)
}

// apiTimeline answers the task's events ([]review.AuditEntry), oldest first.
func (h *Handler) apiTimeline(w http.ResponseWriter, r *http.Request) {
	a, err := h.cfg.Review.Audit(r.Context(), r.PathValue("id"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeJSON(w, http.StatusOK, a.Events)
}

func (h *Handler) apiTrust(w http.ResponseWriter, r *http.Request) {
	all, err := h.cfg.Review.Trust(r.Context())
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeJSON(w, http.StatusOK, all)
}

func (h *Handler) apiAction(w http.ResponseWriter, r *http.Request) {
	req, err := readAction(w, r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	d, err := h.act(r, r.PathValue("action"), r.PathValue("id"), req)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeJSON(w, http.StatusOK, d)
}

// act carries out one decision.
func (h *Handler) act(r *http.Request, action, id string, req ActionRequest) (review.Decision, error) {
	by := h.by(r, req.By)
	if req.SeenDecisions != nil && action != events.ActionCancel {
		return h.cfg.Review.DecideSeen(r.Context(), action, id, req.Note, by, *req.SeenDecisions)
	}
	switch action {
	case events.ActionResolve:
		return h.cfg.Review.Resolve(r.Context(), id, req.Note, by)
	case events.ActionReject:
		return h.cfg.Review.Reject(r.Context(), id, req.Note, by)
	case events.ActionRequeue:
		return h.cfg.Review.Requeue(r.Context(), id, req.Note, by)
	case events.ActionCancel:
		return h.cfg.Review.Cancel(r.Context(), id, req.Note, by)
	}
	return review.Decision{}, fmt.Errorf("%w: unknown action %q (resolve, reject, requeue or cancel)", review.ErrInvalid, action)
}

// readAction decodes a JSON or form body.
func readAction(w http.ResponseWriter, r *http.Request) (ActionRequest, error) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	var req ActionRequest
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "application/json" {
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return req, fmt.Errorf("%w: body: %v", review.ErrInvalid, err)
		}
		if dec.More() {
			return req, fmt.Errorf("%w: body: trailing data after the JSON object", review.ErrInvalid)
		}
		return req, nil
	}
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return req, fmt.Errorf("%w: body over %d bytes", review.ErrInvalid, maxBody)
		}
		return req, fmt.Errorf("%w: form: %v", review.ErrInvalid, err)
	}
	req = ActionRequest{Note: r.PostForm.Get("note"), By: r.PostForm.Get("by")}
	if v := r.PostForm.Get("seen_decisions"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return req, fmt.Errorf("%w: seen_decisions %q is not a count", review.ErrInvalid, v)
		}
		req.SeenDecisions = &n
	}
	return req, nil
}
