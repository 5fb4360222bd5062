package web_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// The queue page shows a shadow policy, when there is one, in a section of
// its own: its revision and, per type the page shows, the fields it sets
// otherwise than the policy in force; without one, no section.
func TestQueuePageShowsTheShadowPolicy(t *testing.T) {
	srv := natstest.Start(t)
	if _, err := services.Provision(bg, srv.JS, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	msg, err := trust.OutcomeMsg("css_fix", trust.Outcome{Key: "o1", Success: true, At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.JS.PublishMsg(bg, msg); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rc, err := review.New(review.Config{JS: srv.JS, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	live := policy.Static(&policy.File{})
	page := func(shadow *policy.Source) string {
		h, err := web.New(web.Config{Review: rc, Token: token, Log: quiet, Policy: live, Shadow: shadow})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(h)
		defer hs.Close()
		req, _ := http.NewRequest("GET", hs.URL+"/", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("queue page: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	if body := page(nil); strings.Contains(body, `id="shadow"`) {
		t.Fatal("a shadow section without a shadow policy")
	}
	shadow := policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": {MaxRetries: 3}}})
	body := page(shadow)
	if !strings.Contains(body, `id="shadow"`) || !strings.Contains(body, "<td><code>css_fix</code></td><td><code>max_retries</code></td>") {
		t.Fatalf("the shadow section is missing or wrong:\n%s", body)
	}
}
