package verifier

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
)

// TestCommandTimeoutKillsProcessGroup checks that a timeout kills the
// command's children too, not only the shell.
func TestCommandTimeoutKillsProcessGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := "sleep 30 & echo $! > " + pidFile + "; wait"
	_, err := (&Command{Argv: []string{"sh", "-c", script}, Timeout: time.Second}).Check(context.Background(), testTask("t1"))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the command did not start its child: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	// The child was sent SIGKILL; wait for the kernel to finish it (it may
	// linger as a zombie until its new parent reaps it).
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still running after the timeout", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid is a process that is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || (stat[i+2] != 'Z' && stat[i+2] != 'X')
}

// A command verifier runs under Config.CommandLimits: it reports them
// itself; one spinning past its CPU time limit is an error that says so.
func TestCommandVerifierLimits(t *testing.T) {
	s, err := New(Config{CommandLimits: procgroup.Limits{CPU: time.Second, Files: 40}})
	if err != nil {
		t.Fatal(err)
	}
	check := func(script string) (events.Verification, error) {
		c, err := s.kinds[policy.VerifierCommand](policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatal(err)
		}
		return c.Check(context.Background(), testTask("t1"))
	}
	if v, err := check("ulimit -t; ulimit -n"); err != nil || v.Detail != "1\n40" {
		t.Errorf("limits reported %q, %v; want 1 s and 40 files", v.Detail, err)
	}
	if _, err := check("while :; do :; done"); !errors.Is(err, procgroup.ErrCPULimit) || !strings.Contains(err.Error(), "CPU time limit") {
		t.Errorf("spinning verifier: %v, want procgroup.ErrCPULimit", err)
	}
}
