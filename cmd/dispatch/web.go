package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/health"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/natsperm"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// cmdWeb serves the review page and its JSON API against a running mesh.
func cmdWeb(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("web", flag.ContinueOnError)
	listen := fs.String("listen", cfg.HTTPListen, "address to serve on (DISPATCH_HTTP_LISTEN); beyond localhost DISPATCH_HTTP_TOKEN is required, else a token is made and printed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("usage: dispatch web [-listen ADDR]")
	}
	log := cfg.logger()
	ln, err := web.Listen(*listen, cfg.HTTPToken)
	if err != nil {
		return err
	}
	nc, err := cfg.connect("", "web")
	if err != nil {
		ln.Close()
		return err
	}
	defer nc.Close()
	token := pageToken(cfg)
	apiToken := clientToken(cfg, ln)
	page, err := newWebPage(ctx, cfg, nc, log, token, apiToken)
	if err != nil {
		ln.Close()
		return err
	}
	defer page.stop()
	if cfg.MetricsListen != "" { // outside the token: probes and Prometheus
		checks := &health.Checks{}
		checks.Add("web", page.ready)
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), page.queue)
		stop, err := serveMetrics(cfg.MetricsListen, reg, nc, checks, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer stop()
	}
	fmt.Fprintf(stdout, "dispatchmesh review page: %s\n", webURL(ln, cfg.HTTPToken, token))
	fmt.Fprintf(stdout, "dispatchmesh client API: %s\n", apiLine(ln, cfg.HTTPClientToken, apiToken))
	return page.serve(ctx, ln, log)
}

// webPage is the review page of a process: its handler, counted for its
// micro service dispatch-web (`nats micro ls`), its readiness, and the
// review queue gauge (dispatch_review_queue) for the process's /metrics.
type webPage struct {
	nc      *nats.Conn
	handler http.Handler
	stats   *services.RunStats
	ops     micro.Service
	queue   *review.QueueGauge
	review  *review.Client
}

// newWebPage builds the review page on nc, requiring token, with the
// client HTTP API when apiToken is set, and registers its micro service.
func newWebPage(ctx context.Context, cfg Config, nc *nats.Conn, log *slog.Logger, token, apiToken string) (*webPage, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	pol, err := watchPolicy(ctx, js, log) // the page shows the thresholds the gate uses
	if err != nil {
		return nil, err
	}
	rc, err := review.New(review.Config{JS: js, Policy: pol, Log: log})
	if err != nil {
		return nil, err
	}
	shadow, err := watchShadow(ctx, js, log) // the page shows the shadow policy
	if err != nil {
		return nil, err
	}
	wc := web.Config{Review: rc, Token: token, Log: log, Policy: pol, Shadow: shadow}
	if apiToken != "" {
		wc.Client = &web.ClientAPI{NC: nc, Token: apiToken, MaxWaits: cfg.HTTPMaxWaits}
	}
	h, err := web.New(wc)
	if err != nil {
		return nil, err
	}
	p := &webPage{nc: nc, stats: &services.RunStats{}, queue: review.NewQueueGauge(rc), review: rc}
	p.handler = shutdownable{Handler: counted(h, p.stats), page: h}
	p.ops, err = services.StartOps(nc, services.OpsConfig{
		Service: "web", Version: version, Instance: instance(),
		Description: "dispatchmesh review page: requests handled, errors (5xx), in flight; readiness",
		Counts:      p.stats.Counts, Ready: p.ready,
	})
	if err != nil {
		return nil, fmt.Errorf("micro service %s: %w", services.OpsName("web"), err)
	}
	// A refused subscription fails silently; after a round trip the
	// server's refusal has arrived.
	if err := nc.FlushTimeout(10 * time.Second); err == nil {
		if perr := natsperm.Last(nc); perr != nil {
			_ = p.ops.Stop()
			return nil, fmt.Errorf("micro service %s: %w", services.OpsName("web"), perr)
		}
	}
	return p, nil
}

// serve serves the page on ln until ctx ends.
func (p *webPage) serve(ctx context.Context, ln net.Listener, log *slog.Logger) error {
	p.stats.SetRunning(true)
	defer p.stats.SetRunning(false)
	return web.Serve(ctx, ln, p.handler, log)
}

// ready is nil while the page serves on a connected NATS connection.
func (p *webPage) ready() error {
	if err := health.Connected(p.nc); err != nil {
		return err
	}
	if !p.stats.Running() {
		return errors.New("not serving")
	}
	return nil
}

// stop stops the micro service and the review client's trust view.
func (p *webPage) stop() { _ = p.ops.Stop(); p.review.Close() }

// counted counts h's requests in stats: in flight, handled, and errors
// (answers 500 and above).
// shutdownable is the counted page that still ends its event streams when
// the server shuts down (web.Serve calls Shutdown).
type shutdownable struct {
	http.Handler
	page *web.Handler
}

func (s shutdownable) Shutdown() { s.page.Shutdown() }

// counted counts the requests h answers; a page's event stream (GET
// /events, open as long as the page) is no request in flight.
func counted(h http.Handler, stats *services.RunStats) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/events" {
			h.ServeHTTP(w, r)
			return
		}
		done := stats.Begin()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		defer func() { done(sw.code >= 500) }()
		h.ServeHTTP(sw, r)
	})
}

// statusWriter remembers the status code of an answer.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// pageToken is the page's token: DISPATCH_HTTP_TOKEN, else one made for
// this process, which only the address printed at start carries.
func pageToken(cfg Config) string {
	if cfg.HTTPToken != "" {
		return cfg.HTTPToken
	}
	return web.NewToken()
}

// clientToken is the client API's token: DISPATCH_HTTP_CLIENT_TOKEN; "" —
// the API off — when that is "off", or unset on a listener beyond
// loopback (a token made here is printed on this terminal only); else one
// made for this process.
func clientToken(cfg Config, ln net.Listener) string {
	switch cfg.HTTPClientToken {
	case "off":
		return ""
	case "":
		if local, err := web.Loopback(ln.Addr().String()); err != nil || !local {
			return ""
		}
		return web.NewToken()
	}
	return cfg.HTTPClientToken
}

// apiBase is the client API's base URL on ln.
func apiBase(ln net.Listener) string {
	addr := ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "localhost"
	}
	return fmt.Sprintf("http://%s/api/v1/tasks", net.JoinHostPort(host, fmt.Sprint(addr.Port)))
}

// apiLine says where the client API is and with which token: the one
// made here, or $DISPATCH_HTTP_CLIENT_TOKEN (never a configured one).
func apiLine(ln net.Listener, configured, token string) string {
	switch {
	case token == "" && configured == "off":
		return "off (DISPATCH_HTTP_CLIENT_TOKEN=off)"
	case token == "":
		return "off (beyond localhost it needs DISPATCH_HTTP_CLIENT_TOKEN)"
	case configured != "":
		return apiBase(ln) + "  (Authorization: Bearer $DISPATCH_HTTP_CLIENT_TOKEN)"
	}
	return apiBase(ln) + "  (Authorization: Bearer " + token + ", a new token each start; DISPATCH_HTTP_CLIENT_TOKEN sets one)"
}

// apiAuth is the Authorization header of the banner's curl lines.
func apiAuth(configured, token string) string {
	if configured != "" {
		return "Authorization: Bearer $DISPATCH_HTTP_CLIENT_TOKEN"
	}
	return "Authorization: Bearer " + token
}

// webURL is what to open in a browser: with the token this process made
// (token, when none is configured), never with a configured one.
func webURL(ln net.Listener, configured, token string) string {
	addr := ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "localhost"
	}
	u := fmt.Sprintf("http://%s/", net.JoinHostPort(host, fmt.Sprint(addr.Port)))
	if configured != "" {
		return u + "  (token required: open it once as /?token=$DISPATCH_HTTP_TOKEN, or send Authorization: Bearer)"
	}
	return u + "?token=" + url.QueryEscape(token) + "  (a new token each start; DISPATCH_HTTP_TOKEN sets one)"
}
