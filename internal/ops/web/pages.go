package web

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

//go:embed templates/*.html
var templateFS embed.FS

var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"money": func(f float64) string { return fmt.Sprintf("$%.4f", f) },
	"score": func(f float64) string { return fmt.Sprintf("%.2f", f) },
	"clip": func(n int, s string) string {
		if r := []rune(s); len(r) > n {
			return string(r[:n]) + "…"
		}
		return s
	},
	"kind":        kind,
	"span":        span,
	"msec":        func(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond },
	"cancellable": review.Cancellable,
	// stopped: a status a human may act on (held, needs_human_review, …),
	// whose reason the explorer shows.
	"stopped":  func(st events.Status) bool { return slices.Contains(review.ReviewStatuses, st) },
	"openable": func(it review.Item) bool { return it.TaskID != "" },
	"plural": func(n int, word string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, word)
		}
		return fmt.Sprintf("%d %ss", n, word)
	},
}

// kind is a CSS class for a reason, status or outcome — a string or a
// string enum such as events.Status: a fixed word, never the input itself.
func kind(v any) string {
	s := ""
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.String {
		s = rv.String()
	}
	switch s {
	case events.ReviewGated, string(events.StatusNeedsHumanReview), string(events.StatusParked), string(events.StatusHeld):
		return "warn"
	case events.ReviewEscalated, events.ReviewStuck, string(events.StatusBlocked), string(events.StatusFailed), events.OutcomeFailure:
		return "bad"
	case events.ReviewPoison:
		return "poison"
	case string(events.StatusSucceeded), events.OutcomeSuccess:
		return "good"
	case string(events.StatusPending), string(events.StatusVerifying), string(events.StatusRunning):
		return "busy"
	}
	return "plain"
}

var pages = map[string]*template.Template{
	"queue": template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/queue.html", "templates/shadow.html")),
	"task":  template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/task.html")),
	"tasks": template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/tasks.html")),
	"bulk":  template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/bulk.html")),
	"error": template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/error.html")),
}

// page is what every page template gets.
type page struct {
	Title string
	OK    string // flash message after an action
	Err   string
	By    string // the name the browser saved
	Now   time.Time
	// Live names a page that follows the live feed (static/live.js):
	// queue, tasks or task; Task is the task page's id.
	Live, Task string
	Data       any
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, code int, name, title string, data any) {
	p := page{Title: title, OK: r.URL.Query().Get("ok"), Err: r.URL.Query().Get("err"), Now: h.cfg.Now(), Data: data}
	if c, err := r.Cookie(byCookie); err == nil {
		p.By, _ = url.QueryUnescape(c.Value)
	}
	switch d := data.(type) {
	case queueData, tasksData:
		p.Live = name
	case taskData:
		p.Live, p.Task = name, d.D.ID
	}
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		h.cfg.Log.Error("web: render", "page", name, "err", err)
		http.Error(w, "could not render the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

func (h *Handler) renderError(w http.ResponseWriter, r *http.Request, err error) {
	code := status(err)
	if code == http.StatusInternalServerError {
		h.cfg.Log.Error("web: page failed", "path", r.URL.Path, "err", err)
	}
	h.render(w, r, code, "error", http.StatusText(code), err.Error())
}

// queueData is the review queue page: one page of items, newest first.
type queueData struct {
	Filter review.Filter
	Queue  review.Queue
	Tabs   []tab
	Trust  []review.TrustView
	// ScanFactor is how many records a filtered page reads per item it can
	// show (review.QueueScanFactor).
	ScanFactor int
	AllLink    string
	// AnsweredLink shows or hides rejections the submit API already
	// answered to their caller (Filter.Answered).
	AnsweredLink string
	Next         string // link to the next (older) page
	First        string // link to the newest page of the same filter
	// ListsHeld: the page lists the held tasks (Filter.ListsHeld); they
	// could not be read when Queue.Held is nil.
	ListsHeld bool
	// Gated is how many types the gate blocks now (the trust table opens
	// when there is one); Reasons are the bulk form's choices.
	Gated   int
	Reasons []string
	// AgeText is the age as typed; Failed is why the page could not be
	// read (bad filter): the form stays with it.
	AgeText, Failed string
	// Shadow is the shadow policy's section (nil: none).
	Shadow *shadowView
}

// tab is one reason filter link with the open items of that reason (-1:
// unknown, the counts could not be read).
type tab struct {
	Label  string
	Link   string
	Open   int
	Active bool
}

func (h *Handler) pageQueue(w http.ResponseWriter, r *http.Request) {
	f, err := filter(r)
	if err != nil {
		// The page stays, with its filter form and the error.
		h.renderQueueError(w, r, err)
		return
	}
	q, err := h.cfg.Review.List(r.Context(), f)
	if err != nil {
		h.renderQueueError(w, r, err)
		return
	}
	q.Open = h.openCounts(r)
	q.Held = h.held(r, f)
	tr, err := h.cfg.Review.Trust(r.Context())
	if err != nil {
		h.renderError(w, r, err)
		return
	}
	// link is this page's query with some parameters changed ("" drops
	// one); a link to another filter starts at the newest page.
	link := func(change map[string]string) string {
		v := r.URL.Query()
		for _, k := range []string{"ok", "err", "token"} {
			v.Del(k)
		}
		for k, val := range change {
			v.Del(k)
			if val != "" {
				v.Set(k, val)
			}
		}
		for k, vals := range v {
			if len(vals) == 0 || vals[0] == "" {
				v.Del(k)
			}
		}
		if len(v) == 0 {
			return "/"
		}
		return "/?" + v.Encode()
	}
	flag := func(b bool) string {
		if b {
			return "1"
		}
		return ""
	}
	d := queueData{
		Filter: f, Queue: q, Trust: tr, ScanFactor: review.QueueScanFactor, ListsHeld: f.ListsHeld(), Reasons: review.Reasons, Shadow: h.shadow(trustTypes(tr)),
		AllLink:      link(map[string]string{"all": flag(!f.All), "cursor": ""}),
		AnsweredLink: link(map[string]string{"answered": flag(!f.Answered), "cursor": ""}),
	}
	if q.Next != "" {
		d.Next = link(map[string]string{"cursor": q.Next})
	}
	if f.Cursor != "" {
		d.First = link(map[string]string{"cursor": ""})
	}
	count := func(reason string) int {
		if q.Open == nil {
			return -1
		}
		return q.Open[reason]
	}
	total := -1 // not known
	if q.Open != nil {
		total = 0
		for _, reason := range review.Reasons {
			total += q.Open[reason]
		}
	}
	for _, t := range tr {
		if t.Gated && !t.Exempt {
			d.Gated++
		}
	}
	d.Tabs = append(d.Tabs, tab{Label: "all", Link: link(map[string]string{"reason": "", "cursor": ""}), Open: total, Active: f.Reason == ""})
	for _, reason := range review.Reasons {
		d.Tabs = append(d.Tabs, tab{Label: reason, Link: link(map[string]string{"reason": reason, "cursor": ""}), Open: count(reason), Active: f.Reason == reason})
	}
	h.render(w, r, http.StatusOK, "queue", "Review queue", d)
}

// renderQueueError shows the queue page's error above its filter form,
// with what the reviewer typed.
func (h *Handler) renderQueueError(w http.ResponseWriter, r *http.Request, err error) {
	code := status(err)
	if code == http.StatusInternalServerError {
		h.cfg.Log.Error("web: page failed", "path", r.URL.Path, "err", err)
	}
	v := r.URL.Query()
	d := queueData{Filter: review.Filter{Type: v.Get("type"), Reason: v.Get("reason")}, Reasons: review.Reasons, Queue: review.Queue{Items: []review.Item{}}}
	d.AgeText = v.Get("age")
	d.Tabs = []tab{{Label: "all", Link: "/", Open: -1}}
	d.Failed = err.Error()
	h.render(w, r, code, "queue", "Review queue", d)
}

// taskData is the task page.
type taskData struct {
	D review.Detail
	X taskExtras
	// Final is the answer the page leads with (FinalOK: a successful one);
	// Ended says who ended the task (a human, which one, or the model);
	// Rows are the attempts with their answers, one table.
	Final   *review.Answer
	FinalOK bool
	Ended   *ending
	Rows    []attemptRow
	Stopped bool // the task waits for a human
	// CanCancel: the task has not ended, a human may cancel it.
	CanCancel bool
}

func (h *Handler) pageTask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	d, err := h.cfg.Review.Show(r.Context(), id)
	if err != nil {
		h.renderError(w, r, err)
		return
	}
	a, err := h.cfg.Review.Audit(r.Context(), id)
	if err != nil {
		h.renderError(w, r, err)
		return
	}
	canCancel := d.Task != nil && review.Cancellable(d.Task.Status)
	td := taskData{D: d, X: extras(a.Events), Stopped: d.Actionable, CanCancel: canCancel}
	td.Final, td.FinalOK = finalAnswer(td.X.Answers)
	td.Ended = endingOf(d.Task, td.Final, td.FinalOK)
	td.Rows = attemptRows(d.Attempts, td.X.Answers)
	h.render(w, r, http.StatusOK, "task", "Task "+id, td)
}

// formAction handles the page's resolve / reject / requeue buttons, then
// sends the browser back with the outcome in a flash message.
func (h *Handler) formAction(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody) // before FormValue parses it
	id, action := r.PathValue("id"), r.PathValue("action")
	back := safeBack(r.FormValue("back"), id)
	req, err := readAction(w, r)
	if err == nil {
		_, err = h.act(r, action, id, req)
	}
	v := url.Values{}
	if err != nil {
		if status(err) == http.StatusInternalServerError {
			h.cfg.Log.Error("web: action failed", "task", id, "action", action, "err", err)
		}
		v.Set("err", err.Error())
	} else {
		v.Set("ok", fmt.Sprintf("%s: %s done", id, action))
	}
	http.Redirect(w, r, back+"?"+v.Encode(), http.StatusSeeOther)
}

// formWhoami saves the reviewer's name in a cookie.
func (h *Handler) formWhoami(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	name := strings.TrimSpace(r.FormValue("by"))
	back := safeBack(r.FormValue("back"), "")
	if review.ValidateBy(name) != nil {
		http.Redirect(w, r, back+"?"+url.Values{"err": {"a name is at most 200 printable characters"}}.Encode(), http.StatusSeeOther)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: byCookie, Value: url.QueryEscape(name), Path: "/", HttpOnly: true,
		SameSite: http.SameSiteLaxMode, MaxAge: 365 * 24 * 3600, Secure: r.TLS != nil,
	})
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// safeBack allows only this server's own pages as redirect targets.
func safeBack(back, id string) string {
	switch {
	case back == "/", back == "/tasks":
		return back
	case back != "" && strings.HasPrefix(back, "/tasks/") && !strings.ContainsAny(back, "?#\\") && !strings.HasPrefix(back, "//"):
		return back
	case id != "":
		return "/tasks/" + url.PathEscape(id)
	}
	return "/"
}
