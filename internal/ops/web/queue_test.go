package web_test

import (
	"html"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
)

// The queue page and /api/review show a page at a time, newest first, with
// a link (a cursor) to the next, what the page read, and the open items per
// reason of the whole queue.
func TestQueuePages(t *testing.T) {
	s := newSeeded(t) // blk-1 escalated, gtd-1 gated
	msgs := reviewtest.FileQueue(t, s.srv.JS, 200)
	var want []string // open items, newest first
	open := map[string]int{events.ReviewEscalated: 1, events.ReviewGated: 1}
	for i := len(msgs) - 1; i >= 0; i-- {
		if m := msgs[i]; !m.Decision() && m.Open && !m.Answered {
			want = append(want, m.Key)
			open[m.Reason]++
		}
	}
	want = append(want, "gtd-1", "blk-1")

	var got []string
	path := "/api/review?limit=25"
	for pages := 0; ; pages++ {
		code, body := s.do("GET", path, "", "")
		q := decode[review.Queue](t, body)
		if code != 200 || len(q.Items) > 25 || q.Scanned > 25*review.QueueScanFactor {
			t.Fatalf("%s: %d, %d items, read %d", path, code, len(q.Items), q.Scanned)
		}
		for _, r := range review.Reasons {
			if q.Open[r] != open[r] {
				t.Fatalf("%s: open counts %v, want %v", path, q.Open, open)
			}
		}
		for _, it := range q.Items {
			got = append(got, it.Key)
		}
		if q.Next == "" {
			break
		}
		path = "/api/review?limit=25&cursor=" + q.Next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the API's pages list %d items, want %d:\n%v\n%v", len(got), len(want), got, want)
	}

	// The page: the newest 25 open items, what it read, the link to the next.
	code, body := s.do("GET", "/?limit=25", "", "")
	if code != 200 {
		t.Fatalf("queue page: %d %s", code, body)
	}
	keys := regexp.MustCompile(`<section class="item [a-z]+" data-task="([^"]+)"`).FindAllStringSubmatch(body, -1)
	if len(keys) != 25 || keys[0][1] != want[0] || keys[24][1] != want[24] {
		t.Fatalf("the page lists %d items starting %v, want 25 from %s", len(keys), keys[:min(len(keys), 1)], want[0])
	}
	scanned := regexp.MustCompile(`id="scanned">(\d+)<`).FindStringSubmatch(body)
	if scanned == nil {
		t.Fatalf("the page does not say what it read:\n%s", body)
	}
	if n, _ := strconv.Atoi(scanned[1]); n < 25 || n > 25*review.QueueScanFactor {
		t.Errorf("the page says it read %d messages", n)
	}
	for _, tab := range []string{`>all <b>` + strconv.Itoa(len(want)) + `</b>`, `>gated <b>` + strconv.Itoa(open[events.ReviewGated]) + `</b>`} {
		if !strings.Contains(body, tab) {
			t.Errorf("the page lacks the tab %q", tab)
		}
	}
	older := regexp.MustCompile(`<a href="([^"]+)" id="older">`).FindStringSubmatch(body)
	if older == nil || !strings.Contains(older[1], "cursor=") || !strings.Contains(older[1], "limit=25") || strings.Contains(body, `id="newest"`) {
		t.Fatalf("no link to the older page:\n%s", body)
	}
	code, body = s.do("GET", html.UnescapeString(older[1]), "", "")
	keys = regexp.MustCompile(`<section class="item [a-z]+" data-task="([^"]+)"`).FindAllStringSubmatch(body, -1)
	if code != 200 || len(keys) != 25 || keys[0][1] != want[25] || !strings.Contains(body, `id="newest"`) {
		t.Fatalf("older page: %d, %d items from %v, want %s", code, len(keys), keys[:min(len(keys), 1)], want[25])
	}

	// A reason and a type are filters of the same page.
	code, body = s.do("GET", "/api/review?reason=gated&type=py_fix&all=1&limit=500", "", "")
	q := decode[review.Queue](t, body)
	n, gated := 0, 1 // gtd-1, css_fix
	for _, m := range msgs {
		if m.Reason == events.ReviewGated {
			gated++
			if m.Type == "py_fix" {
				n++
			}
		}
	}
	if code != 200 || len(q.Items) != n || q.Next != "" || q.Scanned != gated {
		t.Fatalf("gated py_fix: %d, %d items (want %d), read %d of the %d gated records", code, len(q.Items), n, q.Scanned, gated)
	}
}
