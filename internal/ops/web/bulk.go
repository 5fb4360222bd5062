package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

// maxBulkBody bounds a bulk request: a note and up to
// review.MaxBulkTargets ticked items.
const maxBulkBody = maxBody + review.MaxBulkTargets*(16+100)

// BulkResult is what a bulk decision did, per item (POST /api/bulk, the
// page after POST /bulk).
type BulkResult struct {
	Action string `json:"action"`
	By     string `json:"by"`
	Done   int    `json:"done"`
	// Skipped are the items left alone (BulkItem.Why says why; DecidedBy
	// names the reviewer whose decision since stands).
	Skipped int               `json:"skipped"`
	Items   []review.BulkItem `json:"items"`
	// Error ended the bulk decision early (or refused it): the items
	// before it were decided.
	Error string `json:"error,omitempty"`
}

// bulk carries out b, collecting what it did.
func (h *Handler) bulk(r *http.Request, b review.Bulk) (BulkResult, error) {
	b.By = h.by(r, b.By)
	res := BulkResult{Action: b.Action, By: b.By, Items: []review.BulkItem{}}
	err := h.cfg.Review.DecideBulk(r.Context(), b, func(it review.BulkItem) {
		if it.Done {
			res.Done++
		} else {
			res.Skipped++
		}
		res.Items = append(res.Items, it)
	})
	if err != nil {
		res.Error = err.Error()
		if status(err) == http.StatusInternalServerError {
			h.cfg.Log.Error("web: bulk decision stopped", "action", b.Action, "err", err)
		}
	}
	h.cfg.Log.Info("bulk review decision", "action", b.Action, "by", b.By, "done", res.Done, "skipped", res.Skipped)
	return res, err
}

// bulkForm reads the queue page's bulk form: the button pressed (do), the
// note, the ticked items (target=ID@N) and, with matching=1, the type and
// reason whose every other open item is taken too.
func bulkForm(w http.ResponseWriter, r *http.Request) (review.Bulk, error) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBulkBody)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return review.Bulk{}, fmt.Errorf("%w: body over %d bytes", review.ErrInvalid, maxBulkBody)
		}
		return review.Bulk{}, fmt.Errorf("%w: form: %v", review.ErrInvalid, err)
	}
	f := r.PostForm
	b := review.Bulk{Action: f.Get("do"), Note: f.Get("note"), By: f.Get("by")}
	if f.Get("matching") != "" {
		b.Type, b.Reason = strings.TrimSpace(f.Get("type")), strings.TrimSpace(f.Get("reason"))
		if b.Type == "" && b.Reason == "" {
			return b, fmt.Errorf("%w: “every other open item” needs a type or a reason", review.ErrInvalid)
		}
	}
	if len(f["target"]) > review.MaxBulkTargets {
		return b, fmt.Errorf("%w: %d items ticked, at most %d", review.ErrInvalid, len(f["target"]), review.MaxBulkTargets)
	}
	for _, v := range f["target"] {
		t, err := review.ParseTarget(v)
		if err != nil {
			return b, err
		}
		b.Targets = append(b.Targets, t)
	}
	if len(b.Targets) == 0 && b.Type == "" && b.Reason == "" {
		return b, fmt.Errorf("%w: tick the items to act on, or “every other open item” of a type or reason", review.ErrInvalid)
	}
	return b, nil
}

// formBulk handles the queue page's bulk form and shows what it did to
// each item.
func (h *Handler) formBulk(w http.ResponseWriter, r *http.Request) {
	b, err := bulkForm(w, r)
	var res BulkResult
	if err == nil {
		res, err = h.bulk(r, b)
	} else {
		res = BulkResult{Action: b.Action, Error: err.Error()}
	}
	code := http.StatusOK
	if err != nil && len(res.Items) == 0 {
		code = status(err)
	}
	h.render(w, r, code, "bulk", "Bulk "+b.Action, res)
}

// apiBulk takes a JSON review.Bulk and answers a BulkResult.
func (h *Handler) apiBulk(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBulkBody)
	var b review.Bulk
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		h.writeError(w, r, fmt.Errorf("%w: body: %v", review.ErrInvalid, err))
		return
	}
	for i := range b.Targets {
		if b.Targets[i].Seen < 0 {
			b.Targets[i].Seen = -1
		}
	}
	res, err := h.bulk(r, b)
	if err != nil && len(res.Items) == 0 {
		h.writeError(w, r, err)
		return
	}
	h.writeJSON(w, http.StatusOK, res)
}
