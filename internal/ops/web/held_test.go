package web_test

import (
	"html"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// hold writes what the gate writes for a task it holds for its type's
// trust: the task's state (status held) and its held index entry.
func (s *seeded) hold(id, typ string, since time.Time, why string) {
	s.t.Helper()
	kv, err := s.srv.JS.KeyValue(bg, services.BucketHeld)
	if err != nil {
		s.t.Fatal(err)
	}
	st := events.TaskState{ID: id, Type: typ, Subject: "src/" + id + ".css", Status: events.StatusHeld, Pass: 1, Reason: why}
	if _, err := s.tasks.Update(bg, id, func(cur *events.TaskState, _ bool) error { *cur = st; return nil }); err != nil {
		s.t.Fatal(err)
	}
	if err := services.NewHeldIndex(kv).Put(bg, services.HeldEntry{Task: id, Type: typ, Pass: 1, Since: since, Seq: 1, Reason: why}); err != nil {
		s.t.Fatal(err)
	}
}

// The queue page lists the held tasks near the top, oldest first: each
// links to its task page, with its type, since when it is held, the
// gate's reason and when it goes to a human, and the same actions as a
// gated item. /api/review carries them; a reason's page and an older page
// do not list them.
func TestQueueListsHeldTasks(t *testing.T) {
	s := newSeeded(t) // blk-1 escalated, gtd-1 gated
	since := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	s.hold("hld-2", "css_fix", since.Add(time.Minute), "Blocked: css_fix trust score 0.08 below 0.15 "+evil)
	s.hold("hld-1", "css_fix", since, "Blocked: css_fix trust score 0.08 below 0.15")
	s.hold("hld-py", "py_fix", since.Add(2*time.Minute), "Blocked: py_fix trust score 0.00 below 0.15")

	code, body := s.do("GET", "/", "", "")
	if code != 200 {
		t.Fatalf("queue page: %d %s", code, body)
	}
	held := regexp.MustCompile(`<tr data-held="([^"]+)">`).FindAllStringSubmatch(body, -1)
	var ids []string
	for _, m := range held {
		ids = append(ids, m[1])
	}
	if !slices.Equal(ids, []string{"hld-1", "hld-2", "hld-py"}) {
		t.Fatalf("held rows %v, want oldest first:\n%s", ids, body)
	}
	if i, j := strings.Index(body, `id="held"`), strings.Index(body, `data-task="gtd-1"`); i < 0 || j < 0 || i > j {
		t.Errorf("the held section is not above the review records (%d, %d)", i, j)
	}
	toHuman := since.Add(trust.DefaultHoldTime).Format("2006-01-02 15:04:05Z")
	for _, want := range []string{
		`<a href="/tasks/hld-1"><b>hld-1</b></a>`, "2026-03-01 12:00:00Z", "Blocked: css_fix trust score 0.08 below 0.15",
		`<td class="t to-human">` + toHuman + `<div class="muted">held for 24h00m`, "re-admitted when css_fix recovers", "re-admitted when py_fix recovers",
		html.EscapeString(evil), `action="/tasks/hld-1/requeue" data-held="hld-1"`, `formaction="/tasks/hld-1/resolve"`,
		`<input type="hidden" name="seen_decisions" value="0">`, "the default: a type's hold_time in the policy may differ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(body, evil) {
		t.Fatal("a held reason is not escaped")
	}

	q := decode[review.Queue](t, func() string { _, b := s.do("GET", "/api/review?type=py_fix", "", ""); return b }())
	if q.Held == nil || len(q.Held.Items) != 1 || q.Held.Total != 1 || q.Held.HoldTimeFrom != review.HoldTimeFromDefault {
		t.Fatalf("/api/review?type=py_fix: held %+v", q.Held)
	}
	if it := q.Held.Items[0]; it.TaskID != "hld-py" || it.Reason != "Blocked: py_fix trust score 0.00 below 0.15" || !it.ToHuman.Equal(it.Since.Add(trust.DefaultHoldTime)) || it.Status != events.StatusHeld {
		t.Fatalf("held item %+v", it)
	}
	first := decode[review.Queue](t, func() string { _, b := s.do("GET", "/api/review?limit=1", "", ""); return b }())
	if first.Held == nil || first.Held.Total != 3 || first.Next == "" {
		t.Fatalf("/api/review?limit=1: held %+v, next %q", first.Held, first.Next)
	}
	for _, path := range []string{"/api/review?reason=gated", "/api/review?limit=1&cursor=" + url.QueryEscape(first.Next)} {
		if q := decode[review.Queue](t, func() string { _, b := s.do("GET", path, "", ""); return b }()); q.Held != nil {
			t.Errorf("%s lists the held tasks", path)
		}
	}
	if _, body := s.do("GET", "/?reason=gated", "", ""); strings.Contains(body, `data-held=`) {
		t.Error("the gated tab lists the held tasks")
	}

	// A held task's action, from its row's form; it then leaves the list.
	form := url.Values{"note": {"checked by hand"}, "back": {"/"}, "seen_decisions": {"0"}}.Encode()
	resp := s.send("POST", "/tasks/hld-1/resolve", "application/x-www-form-urlencoded", form)
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != 303 || !strings.Contains(loc, "ok=") {
		t.Fatalf("resolve of a held task: %d, back to %s", resp.StatusCode, loc)
	}
	_, body = s.do("GET", "/", "", "")
	if strings.Contains(body, `data-held="hld-1"`) || !strings.Contains(body, `data-held="hld-2"`) || !strings.Contains(body, "1 whose task moved on since (a human acted) left out") {
		t.Fatalf("after the resolve the page still lists hld-1, or no longer says why:\n%s", body)
	}
}
