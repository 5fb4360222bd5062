package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"log/slog"
	"net"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/internal/review"
	"dispatchmesh/internal/web"
)

// cmdWeb serves the review page and its JSON API against a running mesh.
func cmdWeb(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("web", flag.ContinueOnError)
	listen := fs.String("listen", cfg.HTTPListen, "address to serve on (DISPATCH_HTTP_LISTEN); beyond localhost DISPATCH_HTTP_TOKEN is required")
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
	h, err := webHandler(ctx, cfg, nc, log)
	if err != nil {
		ln.Close()
		return err
	}
	if cfg.MetricsListen != "" { // /healthz for probes, outside the token
		stop, err := serveMetrics(cfg.MetricsListen, prometheus.NewRegistry(), nc, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer stop()
	}
	fmt.Fprintf(stdout, "dispatchmesh review page: %s\n", webURL(ln, cfg.HTTPToken))
	return web.Serve(ctx, ln, h, log)
}

// webHandler builds the review page's handler on a NATS connection.
func webHandler(ctx context.Context, cfg Config, nc *nats.Conn, log *slog.Logger) (*web.Handler, error) {
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
	return web.New(web.Config{Review: rc, Token: cfg.HTTPToken, Log: log})
}

// webURL is what to open in a browser (never with the token itself).
func webURL(ln net.Listener, token string) string {
	addr := ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "localhost"
	}
	u := fmt.Sprintf("http://%s/", net.JoinHostPort(host, fmt.Sprint(addr.Port)))
	if token != "" {
		u += "  (token required: open it once as /?token=$DISPATCH_HTTP_TOKEN, or send Authorization: Bearer)"
	}
	return u
}
