package health_test

import (
	"errors"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/health"
)

func TestChecks(t *testing.T) {
	var c health.Checks
	if err := c.Ready(); !errors.Is(err, health.ErrStarting) {
		t.Fatalf("no check yet: %v, want starting", err)
	}
	gate, api := errors.New("not consuming"), errors.New("stopped")
	c.Add("gate", func() error { return gate })
	c.Add("api", func() error { return api })
	if err := c.Ready(); err == nil || err.Error() != "gate: not consuming; api: stopped" {
		t.Fatalf("two parts down: %v", err)
	}
	gate = nil
	c.Add("gate", func() error { return gate }) // replaces, keeps the order
	if err := c.Ready(); err == nil || err.Error() != "api: stopped" {
		t.Fatalf("api down: %v", err)
	}
	api = nil
	if err := c.Ready(); err != nil {
		t.Fatalf("all ready: %v", err)
	}
}
