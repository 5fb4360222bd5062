// Package health serves a process's /healthz and /readyz on its metrics
// listener. /healthz answers 200 while the process runs. /readyz answers
// 200 when the process's NATS connection is up and every part it runs
// (each service: consumer bound and consumed; the review page) says it is
// ready, else 503 with a short reason: a load balancer or Kubernetes sends
// it no work and an operator reads why.
package health

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// ErrStarting is the reason before any part has registered its check.
var ErrStarting = errors.New("starting")

// Checks are a process's readiness checks, by part. The zero value is ready
// to use and not ready (ErrStarting) until a check is added.
type Checks struct {
	mu     sync.Mutex
	names  []string
	checks map[string]func() error
}

// Add sets the readiness check of a part: nil from check means ready.
func (c *Checks) Add(part string, check func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.checks == nil {
		c.checks = map[string]func() error{}
	}
	if _, ok := c.checks[part]; !ok {
		c.names = append(c.names, part)
	}
	c.checks[part] = check
}

// Ready is nil when every part is ready, else an error naming each part
// that is not and why.
func (c *Checks) Ready() error {
	c.mu.Lock()
	names := append([]string(nil), c.names...)
	checks := make([]func() error, len(names))
	for i, n := range names {
		checks[i] = c.checks[n]
	}
	c.mu.Unlock()
	if len(names) == 0 {
		return ErrStarting
	}
	var errs []string
	for i, check := range checks {
		if err := check(); err != nil {
			errs = append(errs, names[i]+": "+err.Error())
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// Connected is nil while nc is connected, else its status.
func Connected(nc *nats.Conn) error {
	if nc == nil {
		return errors.New("nats: no connection")
	}
	if !nc.IsConnected() {
		return fmt.Errorf("nats: %s", strings.ToLower(nc.Status().String()))
	}
	return nil
}

// Handle registers /healthz and /readyz on mux: ready means nc is connected
// and every check of c passes.
func Handle(mux *http.ServeMux, nc *nats.Conn, c *Checks) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		err := Connected(nc)
		if err == nil {
			err = c.Ready()
		}
		if err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
}
