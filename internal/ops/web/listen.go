package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// ErrTokenRequired: the address is reachable from other machines and no
// access token is configured.
var ErrTokenRequired = errors.New("web: an access token is required to listen beyond localhost")

// CheckListen refuses an address beyond loopback without a configured
// token. The token a process makes for itself when none is configured
// (NewToken) does not count: it changes at every start and is printed only
// on this machine's terminal, so a page other machines reach has a token of
// its own (DISPATCH_HTTP_TOKEN).
func CheckListen(addr, token string) error {
	local, err := Loopback(addr)
	if err != nil {
		return fmt.Errorf("web: %w", err)
	}
	if token != "" || local {
		return nil
	}
	return fmt.Errorf("%w: %q is not a loopback address; set DISPATCH_HTTP_TOKEN, or listen on 127.0.0.1", ErrTokenRequired, addr)
}

// Loopback reports whether a listen address ("host:port") is reachable
// from this machine only: localhost or a loopback IP. An empty host
// (":8080"), 0.0.0.0 or [::] listens on every interface; a name other than
// localhost is not trusted to resolve to loopback.
func Loopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// Listen checks the address (CheckListen) and opens it.
func Listen(addr, token string) (net.Listener, error) {
	if err := CheckListen(addr, token); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("web: %w", err)
	}
	return ln, nil
}

// Serve serves h on ln until ctx ends, then shuts down gracefully (requests
// in flight get up to 20 seconds). An h with a Shutdown method (a Handler)
// has it called as the server shuts down: the pages' event streams end.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	srv := &http.Server{
		Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if sh, ok := h.(interface{ Shutdown() }); ok {
		srv.RegisterOnShutdown(sh.Shutdown) // end the event streams, or Shutdown waits for them
	}
	errs := make(chan error, 1)
	go func() { errs <- srv.Serve(ln) }()
	select {
	case err := <-errs:
		return fmt.Errorf("web: %w", err)
	case <-ctx.Done():
	}
	// Requests in flight get 20 s to finish (a decision commits within 15 s).
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("web: shutdown: %w", err)
	}
	if err := <-errs; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("web: %w", err)
	}
	return nil
}
