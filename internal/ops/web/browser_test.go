package web_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
)

// chromium finds a Chromium or Chrome binary. Without one the browser test
// is skipped on a developer machine and fails in CI (CI=true).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium found (install it: apt-get install -y chromium); CI=true, so the browser test may not be skipped")
	}
	t.Skip("no chromium found: install it (apt-get install -y chromium) to run the browser test")
	return ""
}

// browser starts headless Chromium with a fresh profile.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromium(t)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // start the browser now, without a deadline
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// A reviewer opens the page, sees a blocked task, writes a note and clicks
// requeue; the task runs again with the note in its prompt and succeeds.
func TestBrowserRequeueOfBlockedTask(t *testing.T) {
	ctx := browser(t)
	const id, note = "blk-browser", "The null comes from parsePayload, guard it there"
	m := reviewtest.Start(t, reviewtest.FailUnless(note), reviewtest.Options{})
	m.Submit(events.Submit{ID: id, Type: "bug_fix", Subject: "src/api.ts", MaxRetries: 1})
	m.WaitStage(id, "review.escalated", 1) // its only attempt failed: blocked, waiting for a human

	h, err := web.New(web.Config{Review: m.Review, Token: token, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, h)

	rctx, cancel := context.WithTimeout(ctx, reviewtest.Patience)
	defer cancel()
	// The address `dispatch up` prints: the token once, traded for a
	// cookie, and gone from the address bar.
	item := `section[data-task="` + id + `"]`
	if err := chromedp.Do(rctx,
		chromedp.Navigate(srv.URL+"/?token="+token),
		chromedp.WaitVisible(chromedp.CSS(item)),
	); err != nil {
		t.Fatal(err)
	}
	if loc, err := chromedp.Run(rctx, chromedp.Location()); err != nil || loc != srv.URL+"/" {
		t.Errorf("the address bar after the token exchange: %q %v, want %s/", loc, err, srv.URL)
	}
	text, err := chromedp.Run(rctx, chromedp.Text(chromedp.CSS(item)))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"escalated", "blocked", "HANDOFF"} {
		if !strings.Contains(text, want) {
			t.Errorf("the queue item does not say %q:\n%s", want, text)
		}
	}
	if path := os.Getenv("REVIEW_SCREENSHOT"); path != "" {
		shot(t, rctx, path)
	}

	form := `form[data-task="` + id + `"]`
	if err := chromedp.Do(rctx,
		chromedp.SendKeys(chromedp.CSS(form+" textarea"), note),
		chromedp.Click(chromedp.CSS(form+` button[value="requeue"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.flash.ok`)),
	); err != nil {
		t.Fatal(err)
	}

	m.WaitStage(id, events.StageSucceeded, 1)
	if !strings.Contains(m.LastPrompt(), note) {
		t.Fatalf("the model's last request lacks the note:\n%s", m.LastPrompt())
	}

	if err := chromedp.Do(rctx, chromedp.Navigate(srv.URL+"/tasks/"+id), chromedp.WaitVisible(chromedp.CSS("#timeline"))); err != nil {
		t.Fatal(err)
	}
	status, err := chromedp.Run(rctx, chromedp.Text(chromedp.CSS("#status")))
	if err != nil {
		t.Fatal(err)
	}
	if status != string(events.StatusSucceeded) {
		t.Fatalf("the task page shows status %q, want succeeded", status)
	}
	page, err := chromedp.Run(rctx, chromedp.Text(chromedp.CSS("main")))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{note, "REQUEUE by", "followed the reviewer's note"} {
		if !strings.Contains(page, want) {
			t.Errorf("the task page does not show %q", want)
		}
	}
	if path := os.Getenv("REVIEW_SCREENSHOT"); path != "" {
		shot(t, rctx, strings.TrimSuffix(path, ".png")+"-task.png")
	}
}

// serve serves h until the test ends; the pages' event streams end first
// (as web.Serve ends them at shutdown), or Close would wait for them.
func serve(t *testing.T, h *web.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(func() { h.Shutdown(); srv.Close() })
	return srv
}

func shot(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
}
