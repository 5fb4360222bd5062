package web

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

//go:embed static/*.js
var staticFS embed.FS

// ssePing is how often an idle event stream says it is alive (a comment
// line), so proxies keep it open and a gone browser is noticed.
const ssePing = 20 * time.Second

// streams ends every event stream when the server shuts down: a browser
// that follows a page never ends its request by itself.
type streams struct {
	once    sync.Once
	closing chan struct{}
}

func (s *streams) close() { s.once.Do(func() { close(s.closing) }) }

// Shutdown ends the open event streams (Serve calls it as the server shuts
// down; the browsers reconnect to the next server).
func (h *Handler) Shutdown() { h.streams.close() }

// events serves the live feed as server-sent events: one "change" event
// per changed task (review.Change as JSON), for one task with ?task=ID.
// Every browser is a subscriber of the process's one watch (review.Live):
// the request ends when the browser leaves, and its subscription with it.
func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	only := r.URL.Query().Get("task")
	if only != "" && !events.ValidID(only) {
		http.Error(w, "invalid task id", http.StatusBadRequest)
		return
	}
	l, err := h.cfg.Review.Live(r.Context())
	if err != nil {
		h.cfg.Log.Warn("web: live feed", "err", err)
		http.Error(w, "the live feed is not available: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	sub, err := l.Subscribe()
	if err != nil {
		code := http.StatusServiceUnavailable
		if errors.Is(err, review.ErrTooManySubscribers) {
			code = http.StatusTooManyRequests
		}
		http.Error(w, err.Error(), code)
		return
	}
	defer sub.Close()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(s string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(2 * ssePing))
		if _, err := fmt.Fprint(w, s); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send("retry: 3000\n: following\n\n") {
		return
	}
	ping := time.NewTicker(ssePing)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-h.streams.closing:
			return
		case <-ping.C:
			if !send(": ping\n\n") {
				return
			}
		case c, ok := <-sub.C:
			if !ok {
				return // the feed ended: the browser reconnects
			}
			if only != "" && c.ID != only && !c.Lost {
				continue
			}
			data, _ := json.Marshal(c)
			if !send("event: change\ndata: " + string(data) + "\n\n") {
				return
			}
		}
	}
}

// static serves the page's one script.
func (h *Handler) static(w http.ResponseWriter, r *http.Request) {
	data, err := staticFS.ReadFile("static/" + r.PathValue("name"))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(data)
}
