package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// BenchmarkReviewQueue times one page of the review queue (the CLI, the
// JSON API, the page) and one scrape of dispatch_review_queue on a stream
// of DISPATCH_BENCH_RECORDS review records (default 100,000), filed by
// reviewtest.FileQueue:
//
//	go test -run '^$' -bench ReviewQueue -benchtime 5x ./cmd/dispatch/
//
// cli is `dispatch review list` (connect, policy, one page of open items),
// cli-reason-type the same with -reason escalated -type py_fix; api and
// page are GET /api/review and GET / (the review page) on the handler of a
// running process (open counts included), api-deep the page below a cursor
// in the middle of the stream; scrape-first is the first scrape
// of a process just started (bounded by 5 s), counts-first that first
// reading unbounded, scrape every later scrape.
func BenchmarkReviewQueue(b *testing.B) {
	n := 100_000
	if s := os.Getenv("DISPATCH_BENCH_RECORDS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	srv := natstest.Start(b)
	if _, err := services.Provision(context.Background(), srv.JS, services.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	reviewtest.FileQueue(b, srv.JS, n)
	b.Setenv("NATS_URL", srv.ClientURL())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rc, err := review.New(review.Config{JS: srv.JS, Log: quiet})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rc.Close)
	h, err := web.New(web.Config{Review: rc, Token: "bench", Log: quiet})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(h)
	b.Cleanup(hs.Close)
	// The page's process has been running: its first reading of the queue
	// counts (scrape-first below) is behind it.
	if _, err := rc.OpenCounts(context.Background()); err != nil {
		b.Fatal(err)
	}

	cli := func(args ...string) func(b *testing.B) {
		return func(b *testing.B) {
			old := stdout
			stdout = io.Discard
			defer func() { stdout = old }()
			for b.Loop() {
				if err := run(context.Background(), append([]string{"review", "list"}, args...)); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("cli", cli())
	b.Run("cli-reason-type", cli("-reason", "escalated", "-type", "py_fix"))
	get := func(b *testing.B, path string) {
		for b.Loop() {
			req, err := http.NewRequest("GET", hs.URL+path, nil)
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer bench")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("GET %s: %d", path, resp.StatusCode)
			}
		}
	}
	b.Run("api", func(b *testing.B) { get(b, "/api/review") })
	b.Run("page", func(b *testing.B) { get(b, "/") })
	// A page deep in the queue: below a cursor in the middle of the stream
	// (the cursor is a stream sequence in base 36).
	stream, err := srv.JS.Stream(context.Background(), services.Stream)
	if err != nil {
		b.Fatal(err)
	}
	mid := strconv.FormatUint(stream.CachedInfo().State.LastSeq/2, 36)
	b.Run("api-deep", func(b *testing.B) { get(b, "/api/review?cursor="+mid) })
	// A scrape of a process that just started (its first reading), and of
	// one that has been running (every scrape after the first).
	// gather scrapes once; a reading that failed is reported as up0/op.
	gather := func(b *testing.B, reg *prometheus.Registry) {
		fams, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "dispatch_review_queue_up" {
				b.ReportMetric(1-f.GetMetric()[0].GetGauge().GetValue(), "up0/op")
			}
		}
	}
	b.Run("scrape-first", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			fresh, err := review.New(review.Config{JS: srv.JS, Log: quiet})
			if err != nil {
				b.Fatal(err)
			}
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(review.NewQueueGauge(fresh))
			b.StartTimer()
			gather(b, reg)
			b.StopTimer()
			fresh.Close()
			b.StartTimer()
		}
	})
	// The whole first reading of the open counts, without the gauge's 5 s
	// bound (a first scrape cut short reports up 0, and the next goes on).
	b.Run("counts-first", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			fresh, err := review.New(review.Config{JS: srv.JS, Log: quiet})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if _, err := fresh.OpenCounts(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			fresh.Close()
			b.StartTimer()
		}
	})
	b.Run("scrape", func(b *testing.B) {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(review.NewQueueGaugeConfig(rc, review.QueueGaugeConfig{MinInterval: -1}))
		gather(b, reg) // the first reading
		for b.Loop() {
			gather(b, reg)
		}
	})
}
