// Package proctest runs the deployment's real binaries for tests: it builds
// nats-server (a module dependency) and dispatch, starts nats-server from
// the configs and users of deploy/nats, and runs each binary as a
// subprocess in its own process group, killed with its children at
// cleanup. Only tests import it.
package proctest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
)

// Build builds nats-server (the module's dependency) and dispatch into a
// temporary directory and returns their paths.
func Build(t testing.TB) (natsServer, dispatch string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "github.com/nats-io/nats-server/v2", "github.com/dispatchmesh/dispatchmesh/cmd/dispatch")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "nats-server"), filepath.Join(dir, "dispatch")
}

// Root is the module's root directory (where go.mod is), found from the
// working directory up.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Env is this process's environment without DISPATCH_ and NATS_PASSWORD_
// variables, nor NATS_URL, NATS_USER and NATS_PASSWORD (which dispatch
// reads too: a developer's nats CLI settings must not reach the processes
// under test), plus vars.
func Env(vars ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(kv, "DISPATCH_"), strings.HasPrefix(kv, "NATS_PASSWORD_"),
			name == "NATS_URL", name == "NATS_USER", name == "NATS_PASSWORD":
			continue
		}
		env = append(env, kv)
	}
	return append(env, vars...)
}

// WaitFor polls cond until it returns nil, failing the test when it still
// does not after patience (a deadlock guard, not a timing assertion).
func WaitFor(t testing.TB, patience time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Process is a subprocess in its own process group, killed with its
// children at cleanup.
type Process struct {
	Name string
	// Done is closed when the process has exited; Err is then Wait's result.
	Done  chan struct{}
	Err   error
	cmd   *exec.Cmd
	quiet atomic.Bool
	mu    sync.Mutex
	out   bytes.Buffer
}

func (p *Process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

// Output is what the process wrote to stdout and stderr so far.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Tail is the last n bytes of Output, from a rune boundary.
func (p *Process) Tail(n int) string { return textcut.ClipEnd(p.Output(), n) }

// Quiet keeps the output out of a failed test's log (the caller reports
// what matters itself).
func (p *Process) Quiet() { p.quiet.Store(true) }

// Pid is the process id, which is also its process group's.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process (not its group: see procgroup for ending
// a group).
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.Done:
		return true
	default:
		return false
	}
}

// Start runs argv with env as a subprocess named name.
func Start(t testing.TB, name string, env []string, argv ...string) *Process {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &Process{Name: name, Done: make(chan struct{})}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = p, p
	cmd.WaitDelay = procgroup.WaitDelay
	procgroup.KillOnCancel(cmd)
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", name, err)
	}
	p.cmd = cmd
	go func() {
		p.Err = cmd.Wait()
		close(p.Done)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.Done
		if t.Failed() && !p.quiet.Load() {
			t.Logf("--- %s (%v):\n%s", name, p.Err, p.Output())
		}
	})
	return p
}

// CheckRunning fails the test when a process of running has exited.
func CheckRunning(t testing.TB, running map[string]*Process) {
	t.Helper()
	for name, s := range running {
		if s.Exited() {
			t.Fatalf("service %s exited: %v\n%s", name, s.Err, s.Output())
		}
	}
}

// Wait waits up to patience for p to exit and returns its output; a
// process of running that exits first fails the test.
func (p *Process) Wait(t testing.TB, patience time.Duration, running map[string]*Process) string {
	t.Helper()
	timeout := time.After(patience)
	for {
		CheckRunning(t, running)
		select {
		case <-p.Done:
			return p.Output()
		case <-timeout:
			t.Fatalf("%s did not finish:\n%s", p.Name, p.Output())
		case <-time.After(100 * time.Millisecond): // look at the others again
		}
	}
}

// RunToEnd runs argv to its end within patience and returns its output; it
// must succeed.
func RunToEnd(t testing.TB, patience time.Duration, name string, env []string, argv ...string) string {
	t.Helper()
	p := Start(t, name, env, argv...)
	out := p.Wait(t, patience, nil)
	if p.Err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv[1:], " "), p.Err, out)
	}
	return out
}
