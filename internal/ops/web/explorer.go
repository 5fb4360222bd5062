package web

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

// taskQuery reads an explorer query: q (search), id, type, status, subject, since,
// until (RFC 3339, or a date and time in UTC as a datetime-local field
// sends it, or a date), cursor, limit.
func taskQuery(r *http.Request) (review.TaskQuery, error) {
	v := r.URL.Query()
	q := review.TaskQuery{
		ID: strings.TrimSpace(v.Get("id")), Type: strings.TrimSpace(v.Get("type")), Status: events.Status(v.Get("status")),
		Text:    strings.TrimSpace(v.Get("q")),
		Subject: v.Get("subject"), Cursor: v.Get("cursor"),
	}
	var err error
	if q.Since, err = parseTime("since", v.Get("since")); err != nil {
		return q, err
	}
	if q.Until, err = parseTime("until", v.Get("until")); err != nil {
		return q, err
	}
	if l := v.Get("limit"); l != "" {
		if q.Limit, err = strconv.Atoi(l); err != nil {
			return q, fmt.Errorf("%w: limit %q is not a number", review.ErrInvalid, l)
		}
	}
	return q, q.Validate()
}

func parseTime(name, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: %s %q is not a time (2026-05-18T14:22:00Z, 2026-05-18T14:22 UTC, or 2026-05-18)", review.ErrInvalid, name, s)
}

// tasksData is the explorer page.
type tasksData struct {
	Q        review.TaskQuery
	Since    string // the form's values
	Until    string
	Page     review.TaskPage
	Statuses []events.Status
	// ScanFactor is how many entries a page filtered by status reads per
	// task it can show (review.StatusScanFactor).
	ScanFactor int
	Next       string // link to the next (older) page
	First      string // link to the newest page of the same filter
	// Failed is why the query could not be answered (a bad filter): the
	// form stays with what was typed.
	Failed string
}

func (h *Handler) pageTasks(w http.ResponseWriter, r *http.Request) {
	q, err := taskQuery(r)
	var p review.TaskPage
	if err == nil {
		p, err = h.cfg.Review.Tasks(r.Context(), q)
	}
	if err != nil {
		code := status(err)
		if code == http.StatusInternalServerError {
			h.cfg.Log.Error("web: page failed", "path", r.URL.Path, "err", err)
		}
		v := r.URL.Query()
		h.render(w, r, code, "tasks", "Tasks", tasksData{Q: q, Statuses: review.Statuses, Since: v.Get("since"), Until: v.Get("until"),
			Page: review.TaskPage{Tasks: []review.TaskRow{}}, Failed: err.Error()})
		return
	}
	d := tasksData{Q: q, Page: p, Statuses: review.Statuses, ScanFactor: review.StatusScanFactor, Since: formTime(q.Since), Until: formTime(q.Until)}
	link := func(cursor string) string {
		v := r.URL.Query()
		v.Del("cursor")
		if cursor != "" {
			v.Set("cursor", cursor)
		}
		for k, vals := range v {
			if len(vals) == 0 || vals[0] == "" {
				v.Del(k)
			}
		}
		if len(v) == 0 {
			return "/tasks"
		}
		return "/tasks?" + v.Encode()
	}
	if p.Next != "" {
		d.Next = link(p.Next)
	}
	if q.Cursor != "" {
		d.First = link("")
	}
	h.render(w, r, http.StatusOK, "tasks", "Tasks", d)
}

func formTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04")
}

// apiTasks answers one page of the explorer (review.TaskPage).
func (h *Handler) apiTasks(w http.ResponseWriter, r *http.Request) {
	q, err := taskQuery(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	p, err := h.cfg.Review.Tasks(r.Context(), q)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeJSON(w, http.StatusOK, p)
}

// step is one timeline entry with the time since the one before and since
// the first.
type step struct {
	review.AuditEntry
	Since, Total time.Duration
	First        bool
	// Text is the entry as a sentence (readable).
	Text string
}

// taskExtras is what the task page shows beyond review.Detail: the
// payload, every model answer (as `dispatch status -v` prints them) and
// the timeline with durations.
type taskExtras struct {
	Payload string
	Answers []review.Answer
	Steps   []step
	Total   time.Duration
	// Gates are the gate's decisions on the task, with their causes.
	Gates []gateDecision
}

func extras(entries []review.AuditEntry) taskExtras {
	var x taskExtras
	for i, e := range entries {
		s := step{AuditEntry: e, First: i == 0, Text: readable(e)}
		if g, ok := gateOf(e); ok {
			x.Gates = append(x.Gates, g)
		}
		if i > 0 {
			s.Since, s.Total = e.Time.Sub(entries[i-1].Time), e.Time.Sub(entries[0].Time)
			x.Total = s.Total
		}
		x.Steps = append(x.Steps, s)
		if x.Payload == "" {
			if p, ok := review.PayloadOf(e.Entry); ok {
				x.Payload = review.IndentPayload(p)
			}
		}
		if a, ok := review.AnswerOf(e.Entry); ok {
			x.Answers = append(x.Answers, a)
		}
	}
	return x
}

// span prints a duration for people: 850ms, 12.3s, 4m05s, 2h03m.
func span(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}
