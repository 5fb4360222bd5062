package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"html"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
)

// The explorer searches id, type, subject, reason and answer text, any
// case; a bad filter shows its error above the form, which keeps what was
// typed — on the explorer and on the queue.
func TestSearchAndBadFilter(t *testing.T) {
	s := newSeeded(t) // blk-1 escalated (HANDOFF…), gtd-1 gated, run-1 running: css_fix
	s.publish(events.TaskSubject("run-1", events.StageExecuted), events.EventExecuted, "executor@test", "",
		events.Executed{Base: events.Base{Task: events.Task{ID: "run-1", Type: "css_fix"}}, Result: events.Result{Outcome: events.OutcomeSuccess, Summary: "Centred the Flexbox header"}})
	for q, want := range map[string][]string{"handoff": {"blk-1"}, "BLK": {"blk-1"}, "src/gtd": {"gtd-1"}, "CSS_FIX": {"run-1", "gtd-1", "blk-1"}} {
		code, body := s.do("GET", "/api/tasks?q="+q, "", "")
		p := decode[review.TaskPage](t, body)
		var got []string
		for _, r := range p.Tasks {
			got = append(got, r.ID)
		}
		if code != 200 || p.Via != review.ViaSearch || strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("q=%s: %d %v, want %v", q, code, got, want)
		}
	}
	// The answer arrives on the stream by its own consumer: wait for it.
	deadline := time.Now().Add(reviewtest.Patience)
	for {
		code, body := s.do("GET", "/tasks?q=flexbox", "", "")
		if code == 200 && strings.Contains(body, `data-task="run-1"`) && !strings.Contains(body, `data-task="blk-1"`) {
			if !strings.Contains(body, `value="flexbox"`) {
				t.Errorf("the search form does not keep the text:\n%s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the answer text never became searchable: %d\n%s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}

	code, body := s.do("GET", "/tasks?q=css&since=yesterday&type=css_fix", "", "")
	if code != http.StatusBadRequest || !strings.Contains(body, `id="filter-error"`) || !strings.Contains(body, `since &#34;yesterday&#34; is not a time`) ||
		!strings.Contains(body, `value="css"`) || !strings.Contains(body, `value="yesterday"`) || !strings.Contains(body, `value="css_fix"`) || !strings.Contains(body, `id="filters"`) {
		t.Errorf("a bad explorer filter: %d\n%s", code, body)
	}
	code, body = s.do("GET", "/?age=soon&type=css_fix", "", "")
	if code != http.StatusBadRequest || !strings.Contains(body, `id="filter-error"`) || !strings.Contains(html.UnescapeString(body), `age "soon" is not a duration`) ||
		!strings.Contains(body, `value="soon"`) || !strings.Contains(body, `id="queue-filter"`) {
		t.Errorf("a bad queue filter: %d\n%s", code, body)
	}
}

// GET /events streams a change per changed task (?task=: that one) from
// the one watch; the subscription ends with the request, and every stream
// ends at Shutdown.
func TestEventStream(t *testing.T) {
	s := newSeeded(t)
	l, err := s.rc.Live(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Ready(bg); err != nil {
		t.Fatal(err)
	}
	open := func(path string) (*http.Response, *bufio.Reader) {
		resp := s.send("GET", path, "", "")
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return resp, bufio.NewReader(resp.Body)
	}
	change := func(r *bufio.Reader) review.Change {
		t.Helper()
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("the stream ended: %v", err)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				var c review.Change
				if err := json.Unmarshal([]byte(data), &c); err != nil {
					t.Fatal(err)
				}
				return c
			}
		}
	}
	all, allR := open("/events")
	one, oneR := open("/events?task=blk-1")
	// The first line is written once subscribed: wait for both.
	for _, r := range []*bufio.Reader{allR, oneR} {
		if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "retry:") {
			t.Fatalf("first line %q %v", line, err)
		}
	}
	if n := l.Subscribers(); n != 2 {
		t.Fatalf("%d subscribers, want 2", n)
	}
	for _, id := range []string{"run-1", "blk-1"} {
		if _, err := s.tasks.Update(bg, id, func(cur *events.TaskState, _ bool) error { cur.Reason += " (seen)"; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if c := change(allR); c.ID != "run-1" {
		t.Fatalf("the whole feed's first change: %+v, want run-1", c)
	}
	if c := change(allR); c.ID != "blk-1" {
		t.Fatalf("the whole feed's second change: %+v, want blk-1", c)
	}
	if c := change(oneR); c.ID != "blk-1" || c.Status != events.StatusBlocked {
		t.Fatalf("blk-1's feed: %+v, want blk-1 only", c)
	}
	all.Body.Close() // the browser leaves: its subscription goes
	deadline := time.Now().Add(reviewtest.Patience)
	for l.Subscribers() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscribers after one left, want 1", l.Subscribers())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, _ := s.do("GET", "/events?task=bad%20id", "", ""); code != http.StatusBadRequest {
		t.Errorf("a bad task id: %d", code)
	}
	s.h.Shutdown()
	for {
		if _, err := oneR.ReadString('\n'); err != nil {
			break // ended
		}
	}
	one.Body.Close()
}

// POST /api/bulk decides each item as a single decision and reports each;
// a decision taken since the reviewer looked stands and is named.
func TestBulkAPI(t *testing.T) {
	s := newSeeded(t)
	if code, body := s.do("POST", "/api/tasks/blk-1/resolve", "application/json", `{"note":"fixed by hand","by":"bob"}`); code != 200 {
		t.Fatalf("bob's resolve: %d %s", code, body)
	}
	// The task page says a human ended it, and which.
	if code, body := s.do("GET", "/tasks/blk-1", "", ""); code != 200 || !strings.Contains(body, `<div id="ended"><span class="badge warn">human</span> <b>Resolved by a human, bob</b>`) ||
		!strings.Contains(body, "fixed by hand") {
		t.Errorf("the task page of a task bob resolved: %d\n%s", code, body)
	}
	code, body := s.do("POST", "/api/bulk", "application/json",
		`{"action":"reject","targets":[{"id":"blk-1","seen_decisions":0},{"id":"gtd-1","seen_decisions":0}],"note":"obsolete","by":"alice"}`)
	res := decode[web.BulkResult](t, body)
	if code != 200 || res.Done != 1 || res.Skipped != 1 || len(res.Items) != 2 || res.Items[0].DecidedBy != "bob" || !res.Items[1].Done || res.By != "alice" {
		t.Fatalf("bulk: %d %+v", code, res)
	}
	for _, bad := range []string{`{"action":"reject","note":"x"}`, `{"action":"cancel","type":"css_fix","note":"x"}`, `{"action":"reject","type":"css_fix"}`, `{"nope":1}`} {
		if code, body := s.do("POST", "/api/bulk", "application/json", bad); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, code, body)
		}
	}
	// The form: nothing ticked and no type or reason is refused on the
	// result page.
	code, body = s.do("POST", "/bulk", "application/x-www-form-urlencoded", "do=requeue&note=x", "Origin", s.http.URL)
	if code != http.StatusBadRequest || !strings.Contains(body, `id="bulk-error"`) {
		t.Errorf("an empty bulk form: %d\n%s", code, body)
	}
}

// Serve ends the pages' event streams as it shuts down: it returns
// without error while a page follows the feed (otherwise the shutdown
// would wait for the stream and fail on its deadline).
func TestServeEndsEventStreams(t *testing.T) {
	s := newSeeded(t)
	ln, err := web.Listen("127.0.0.1:0", token)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	served := make(chan error, 1)
	go func() { served <- web.Serve(ctx, ln, s.h, nil) }()
	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "retry:") {
		t.Fatalf("first line %q %v", line, err)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(reviewtest.Patience):
		t.Fatal("Serve never returned")
	}
}
