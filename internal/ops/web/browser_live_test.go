package web_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
)

// shots is where the browser tests put their screenshots: the directory
// REVIEW_SCREENSHOTS names, else the test's temporary directory.
func shots(t *testing.T) string {
	if dir := os.Getenv("REVIEW_SCREENSHOTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.TempDir()
}

// view saves what the browser window shows now (the top of the page, as
// a reviewer first sees it).
func view(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A reviewer opens a queue of more than 100 items, filters it to one
// type's gated items, ticks two and asks for every other open one of that
// type and reason, writes one note and clicks requeue once: every item is
// requeued as a single decision, except the one another reviewer resolved
// meanwhile, which keeps their decision and is named. Then the queue page,
// left untouched, drops an item a third reviewer resolves, without a
// reload.
func TestBrowserBulkRequeue(t *testing.T) {
	ctx := browser(t)
	s := newSeeded(t)
	filed := reviewtest.FileQueue(t, s.srv.JS, 200)
	open := 0
	for _, f := range filed {
		if !f.Decision() && f.Open && !f.Answered {
			open++
		}
	}
	if open < 100 {
		t.Fatalf("the queue has %d open items, want at least 100", open)
	}
	gated, err := s.rc.List(bg, review.Filter{Type: "css_fix", Reason: events.ReviewGated, Limit: review.MaxPageSize})
	if err != nil || len(gated.Items) < 10 || gated.Next != "" {
		t.Fatalf("%d open gated css_fix items (%v), want 10 or more on one page", len(gated.Items), err)
	}
	// FileQueue's r<i> tasks were gated, requeued and gated again without
	// a task event on the stream: they cannot be sent again (ErrNoTask).
	var sendable []string
	for _, it := range gated.Items {
		if !strings.HasPrefix(it.Key, "r") {
			sendable = append(sendable, it.Key)
		}
	}
	dir := shots(t)
	rctx, cancel := context.WithTimeout(ctx, reviewtest.Patience)
	defer cancel()
	first, second := sendable[0], sendable[1]
	tick := func(id string) string { return `input[data-tick="` + id + `"]` }
	if err := chromedp.Do(rctx,
		chromedp.Navigate(s.http.URL+"/?token="+token),
		chromedp.WaitVisible(chromedp.CSS(`#bulk`)),
	); err != nil {
		t.Fatal(err)
	}
	view(t, rctx, filepath.Join(dir, "queue.png"))
	if err := chromedp.Do(rctx,
		chromedp.Navigate(s.http.URL+"/?reason=gated&type=css_fix&limit=20"),
		chromedp.WaitVisible(chromedp.CSS(tick(second))),
		chromedp.Click(chromedp.CSS(tick(first))),
		chromedp.Click(chromedp.CSS(tick(second))),
	); err != nil {
		t.Fatal(err)
	}
	// Bob resolves the second meanwhile: the page follows the feed, but
	// with items ticked it is left alone and says it changed.
	if _, err := s.rc.Resolve(bg, second, "fixed by hand", "bob"); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(rctx,
		chromedp.WaitVisible(chromedp.CSS(`#stale`)),
		chromedp.Click(chromedp.CSS(`#bulk-matching`)),
		chromedp.SendKeys(chromedp.CSS(`#bulk textarea`), "The gate was too strict: run them again"),
	); err != nil {
		t.Fatal(err)
	}
	view(t, rctx, filepath.Join(dir, "bulk-form.png"))
	if err := chromedp.Do(rctx,
		chromedp.Click(chromedp.CSS(`#bulk button[value="requeue"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#bulk-items`)),
	); err != nil {
		t.Fatal(err)
	}
	view(t, rctx, filepath.Join(dir, "bulk-result.png"))
	summary, err := chromedp.Run(rctx, chromedp.Text(chromedp.CSS(`#bulk-summary`)))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d requeued, %d left alone", len(sendable)-1, len(gated.Items)-len(sendable)+1); !strings.Contains(summary, want) {
		t.Errorf("the result says %q, want %q", summary, want)
	}
	row, err := chromedp.Run(rctx, chromedp.Text(chromedp.CSS(`tr[data-item="`+second+`"]`)))
	if err != nil || !strings.Contains(row, "decided by bob") {
		t.Errorf("the item Bob resolved: %q %v, want it named", row, err)
	}
	if st := s.state(second); st.Status != events.StatusSucceeded {
		t.Errorf("Bob's resolve was overturned: %s", st.Status)
	}
	for _, id := range sendable {
		if st := s.state(id); id != second && st.Status != events.StatusPending {
			t.Errorf("%s is %s after the bulk requeue", id, st.Status)
		}
	}
	if left, err := s.rc.List(bg, review.Filter{Type: "css_fix", Reason: events.ReviewGated}); err != nil || len(left.Items) != len(gated.Items)-len(sendable) {
		t.Errorf("%d gated css_fix items still open (%v), want the %d that cannot be sent again", len(left.Items), err, len(gated.Items)-len(sendable))
	}

	// The queue page, left untouched, follows: an item another reviewer
	// resolves leaves it without a reload.
	left, err := s.rc.List(bg, review.Filter{Type: "css_fix", Reason: events.ReviewGated})
	if err != nil || len(left.Items) == 0 {
		t.Fatalf("no item left to resolve: %v", err)
	}
	item := `section[data-task="` + left.Items[0].Key + `"]`
	if err := chromedp.Do(rctx,
		chromedp.Navigate(s.http.URL+"/?reason=gated&type=css_fix"),
		chromedp.WaitVisible(chromedp.CSS(item)),
	); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(rctx, chromedp.Evaluate[bool](`window.stillTheSamePage = true`)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(rctx, chromedp.Poll[bool](`document.body.dataset.following === "1"`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.rc.Resolve(bg, left.Items[0].Key, "done by hand", "carol"); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(rctx, chromedp.WaitNotPresent(chromedp.CSS(item))); err != nil {
		t.Fatalf("the queue page never dropped the resolved item: %v", err)
	}
	if same, err := chromedp.Run(rctx, chromedp.Evaluate[bool](`window.stillTheSamePage === true`)); err != nil || !same {
		t.Fatalf("the queue page was reloaded (%v)", err)
	}
	t.Logf("screenshots in %s", dir)
}

// A reviewer has a running task's page open, and the explorer in another
// tab; the task ends, and both show the end — the page its status, who
// solved it and the answer — without a reload.
func TestBrowserTaskPageFollowsTheEnd(t *testing.T) {
	ctx := browser(t)
	const id = "live-1"
	m := reviewtest.Start(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("Centred the header with a flex container")}
	}, reviewtest.Options{})
	m.Model.Started = make(chan openaitest.Request, 2)
	m.Model.Block = make(chan struct{})
	m.Submit(events.Submit{ID: id, Type: "css_fix", Subject: "src/app.css", Payload: []byte(`{"issue":"header off-centre"}`)})
	wait(t, m.Model.Started, "the model call")

	h, err := web.New(web.Config{Review: m.Review, Token: token, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	dir := shots(t)
	rctx, cancel := context.WithTimeout(ctx, reviewtest.Patience)
	defer cancel()
	if err := chromedp.Do(rctx,
		chromedp.Navigate(srv.URL+"/tasks/"+id+"?token="+token),
		chromedp.WaitVisible(chromedp.CSS(`#status.busy`)),
	); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(rctx, chromedp.Evaluate[bool](`window.stillTheSamePage = true`)); err != nil {
		t.Fatal(err)
	}
	// Subscribed before the end (the stream is open).
	if _, err := chromedp.Run(rctx, chromedp.Poll[bool](`document.body.dataset.following === "1"`)); err != nil {
		t.Fatal(err)
	}
	shot(t, rctx, filepath.Join(dir, "task-running.png"))
	// The explorer, in a second tab, follows too.
	tab, cancelTab := chromedp.NewContext(ctx)
	defer cancelTab()
	tctx, cancelT := context.WithTimeout(tab, reviewtest.Patience)
	defer cancelT()
	row := `#tasks tr[data-task="` + id + `"]`
	if err := chromedp.Do(tctx,
		chromedp.Navigate(srv.URL+"/tasks"),
		chromedp.WaitVisible(chromedp.CSS(row+` .badge.busy`)),
	); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.stillTheSamePage = true`)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(tctx, chromedp.Poll[bool](`document.body.dataset.following === "1"`)); err != nil {
		t.Fatal(err)
	}
	close(m.Model.Block) // the model answers: the task succeeds
	m.WaitStage(id, events.StageSucceeded, 1)
	if err := chromedp.Do(rctx,
		chromedp.WaitVisible(chromedp.CSS(`#status.good`)),
		chromedp.WaitVisible(chromedp.CSS(`#final`)),
	); err != nil {
		t.Fatal(err)
	}
	if same, err := chromedp.Run(rctx, chromedp.Evaluate[bool](`window.stillTheSamePage === true`)); err != nil || !same {
		t.Fatalf("the page was reloaded (%v)", err)
	}
	shot(t, rctx, filepath.Join(dir, "task-ended.png"))
	if err := chromedp.Do(tctx, chromedp.WaitVisible(chromedp.CSS(row+` .badge.good`))); err != nil {
		t.Fatalf("the explorer never showed the end: %v", err)
	}
	if same, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`window.stillTheSamePage === true`)); err != nil || !same {
		t.Fatalf("the explorer was reloaded (%v)", err)
	}
	view(t, tctx, filepath.Join(dir, "explorer-ended.png"))
	page, err := chromedp.Run(rctx, chromedp.Text(chromedp.CSS("main")))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"succeeded", "Solved by the model", "Centred the header", "The gate admitted it", "Queued: css_fix on src/app.css", "Solved by the model"} {
		if !strings.Contains(page, want) {
			t.Errorf("the task page does not show %q:\n%s", want, page)
		}
	}
	if i, j := strings.Index(page, "Centred the header"), strings.Index(page, "Timeline"); i < 0 || i > j {
		t.Errorf("the answer is not above the timeline")
	}
	t.Logf("screenshots in %s", dir)
}
