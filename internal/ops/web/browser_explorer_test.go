package web_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
)

// A reviewer finds a running task in the explorer, filters by its type,
// cancels it from the list; the model's request is cancelled, and the task
// page shows it cancelled, with its payload and timeline.
func TestBrowserExplorerAndCancel(t *testing.T) {
	ctx := browser(t)
	m := reviewtest.Start(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("never answered")}
	}, reviewtest.Options{})
	m.Model.Started = make(chan openaitest.Request, 2)
	m.Model.Block = make(chan struct{})
	m.Model.Cancelled = make(chan openaitest.Request, 2)
	defer close(m.Model.Block)
	// One at a time, so they are queued (and listed) in this order.
	m.Submit(events.Submit{ID: "brw-other", Type: "css_fix", Subject: "src/app.css"})
	wait(t, m.Model.Started, "the first model call")
	m.Submit(events.Submit{ID: "brw-run", Type: "bug_fix", Subject: "src/api.ts", Payload: []byte(`{"issue":"null deref in parsePayload"}`)})
	wait(t, m.Model.Started, "the second model call")

	h, err := web.New(web.Config{Review: m.Review, Token: token, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)
	rctx, cancel := context.WithTimeout(ctx, reviewtest.Patience)
	defer cancel()

	row := func(id string) string { return `#tasks tr[data-task="` + id + `"]` }
	if err := chromedp.Do(rctx,
		chromedp.Navigate(srv.URL+"/tasks?token="+token),
		chromedp.WaitVisible(chromedp.CSS(row("brw-other"))),
		chromedp.WaitVisible(chromedp.CSS(row("brw-run"))),
	); err != nil {
		t.Fatal(err)
	}
	list, err := chromedp.Run(rctx, chromedp.Text(chromedp.CSS("#tasks")))
	if err != nil {
		t.Fatal(err)
	}
	if i, j := strings.Index(list, "brw-run"), strings.Index(list, "brw-other"); i < 0 || j < 0 || i > j || !strings.Contains(list, "running") {
		t.Fatalf("the explorer does not list brw-run (running) before brw-other:\n%s", list)
	}

	if path := os.Getenv("REVIEW_SCREENSHOT"); path != "" {
		shot(t, rctx, strings.TrimSuffix(path, ".png")+"-explorer.png")
	}
	if err := chromedp.Do(rctx,
		chromedp.SendKeys(chromedp.CSS(`#filters input[name="type"]`), "bug_fix"),
		chromedp.Click(chromedp.CSS(`#filters button[type="submit"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(row("brw-other"))),
		chromedp.WaitVisible(chromedp.CSS(row("brw-run"))),
		chromedp.Click(chromedp.CSS(row("brw-run")+` form[data-cancel="brw-run"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`.flash.ok`)),
	); err != nil {
		t.Fatal(err)
	}
	if req := wait(t, m.Model.Cancelled, "the cancelled model request"); !strings.Contains(string(req.Body), "parsePayload") {
		t.Fatalf("the cancelled request is not brw-run's: %s", req.Body)
	}

	if err := chromedp.Do(rctx,
		chromedp.Navigate(srv.URL+"/tasks?status=cancelled"),
		chromedp.WaitVisible(chromedp.CSS(row("brw-run"))),
		chromedp.Navigate(srv.URL+"/tasks/brw-run"),
		chromedp.WaitVisible(chromedp.CSS("#timeline")),
	); err != nil {
		t.Fatal(err)
	}
	status, err := chromedp.Run(rctx, chromedp.Text(chromedp.CSS("#status")))
	if err != nil {
		t.Fatal(err)
	}
	page, err := chromedp.Run(rctx, chromedp.Text(chromedp.CSS("main")))
	if err != nil {
		t.Fatal(err)
	}
	if status != string(events.StatusCancelled) {
		t.Fatalf("the task page shows status %q, want cancelled", status)
	}
	for _, want := range []string{"null deref in parsePayload", "CANCEL by", "prompted", "events over"} {
		if !strings.Contains(page, want) {
			t.Errorf("the task page does not show %q", want)
		}
	}
	if path := os.Getenv("REVIEW_SCREENSHOT"); path != "" {
		shot(t, rctx, strings.TrimSuffix(path, ".png")+"-cancelled.png")
	}
	if st := m.State("brw-other"); st.Status != events.StatusRunning {
		t.Errorf("brw-other is %s: cancelling brw-run touched it", st.Status)
	}
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(reviewtest.Patience):
		t.Fatalf("waited %s for %s", reviewtest.Patience, what)
		panic("unreachable")
	}
}
