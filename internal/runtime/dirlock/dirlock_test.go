package dirlock_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/dirlock"
)

// flock locks conflict between two opens of the file even in one process,
// so a second Acquire here stands for a second process.
func TestSecondAcquireIsRefusedUntilRelease(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	first, err := dirlock.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = dirlock.Acquire(dir)
	var held *dirlock.HeldError
	if !errors.As(err, &held) || held.PID != os.Getpid() || held.Dir != dir {
		t.Fatalf("second Acquire: %#v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, dir+" is in use by another process (pid ") {
		t.Fatalf("message %q", msg)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := dirlock.Acquire(dir)
	if err != nil {
		t.Fatalf("after Release: %v", err)
	}
	again.Release()
}
