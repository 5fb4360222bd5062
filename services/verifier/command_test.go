package verifier

import (
	"context"
	"errors"
	"io/fs"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

func TestCommand(t *testing.T) {
	tests := []struct {
		name    string
		script  string
		verdict string
		detail  string
	}{
		{"exit 0", "exit 0", events.VerdictExists, ""},
		{"exit 1", "echo fixed upstream >&2; exit 1", events.VerdictStale, "fixed upstream"},
		{"reads task on stdin", `grep -q '"id":"t1"' && echo found t1`, events.VerdictExists, "found t1"},
		{"combined output", "echo out; echo err >&2; exit 1", events.VerdictStale, "out\nerr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := (&Command{Argv: []string{"sh", "-c", tt.script}}).Check(context.Background(), testTask("t1"))
			if err != nil {
				t.Fatal(err)
			}
			if v.Verdict != tt.verdict || v.Detail != tt.detail || v.Verifier != "command" {
				t.Errorf("got %+v, want %s %q", v, tt.verdict, tt.detail)
			}
		})
	}
}

func TestCommandOtherExitIsError(t *testing.T) {
	_, err := (&Command{Argv: []string{"sh", "-c", "echo lint crashed; exit 3"}}).Check(context.Background(), testTask("t1"))
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(err.Error(), "lint crashed") {
		t.Fatalf("err = %v, want exit status 3 with output", err)
	}
}

func TestCommandTimeout(t *testing.T) {
	_, err := (&Command{Argv: []string{"sh", "-c", "sleep 5"}, Timeout: 100 * time.Millisecond}).Check(context.Background(), testTask("t1"))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
}

func TestCommandStartFailure(t *testing.T) {
	_, err := (&Command{Argv: []string{"/nonexistent/still-broken"}}).Check(context.Background(), testTask("t1"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want not exist", err)
	}
	if _, err := (&Command{}).Check(context.Background(), testTask("t1")); err == nil {
		t.Fatal("empty argv: want an error")
	}
}

func TestCommandShutdownIsNotAVerdict(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := (&Command{Argv: []string{"sh", "-c", "exit 0"}}).Check(ctx, testTask("t1"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestCommandOutputIsClipped(t *testing.T) {
	v, err := (&Command{Argv: []string{"sh", "-c", "i=0; while [ $i -lt 500 ]; do echo 0123456789; i=$((i+1)); done"}}).Check(context.Background(), testTask("t1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Detail) > MaxDetail || !strings.HasPrefix(v.Detail, "0123456789\n") {
		t.Errorf("detail is %d bytes (%.20q…), want at most %d", len(v.Detail), v.Detail, MaxDetail)
	}
}
