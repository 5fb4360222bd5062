package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"dispatchmesh/internal/procgroup"
)

// runMainEnv makes this test binary run main() instead of the tests, so a
// test can start `dispatch` as a process of its own.
const runMainEnv = "DISPATCH_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startUp runs `dispatch up` on dataDir as a process, killed at cleanup,
// waits until it says it is up, and returns its NATS URL.
func startUp(t *testing.T, dataDir string) (pid int, url string, kill func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := upCommand(ctx, dataDir)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	kill = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(kill)
	deadline := time.Now().Add(30 * time.Second) // a deadlock guard
	for !strings.Contains(out.String(), "is up") {
		select {
		case err := <-done:
			t.Fatalf("dispatch up exited: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dispatch up never came up:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	m := natsURL.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("dispatch up printed no NATS URL:\n%s", out.String())
	}
	return cmd.Process.Pid, m[1], kill
}

// natsURL finds the URL in up's banner ("  NATS:     nats://…").
var natsURL = regexp.MustCompile(`NATS:\s+(nats://\S+)`)

func upCommand(ctx context.Context, dataDir string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "up")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DISPATCH_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, runMainEnv+"=1", "DISPATCH_DATA_DIR="+dataDir,
		"DISPATCH_NATS_LISTEN=127.0.0.1:-1", "DISPATCH_HTTP_LISTEN=off")
	cmd.WaitDelay = procgroup.WaitDelay
	procgroup.KillOnCancel(cmd)
	return cmd
}

// A second `dispatch up` on the data dir of a running one exits non-zero,
// naming the dir and the first one's pid, without touching the store. Once
// the first is gone (killed: the kernel drops its lock) the dir is free.
func TestSecondUpOnOneDataDirFails(t *testing.T) {
	dataDir := t.TempDir()
	pid, _, kill := startUp(t, dataDir)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := upCommand(ctx, dataDir).CombinedOutput()
	want := fmt.Sprintf("data dir %s is in use by another process (pid %d)", dataDir, pid)
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), want) || strings.Contains(string(out), "is up") {
		t.Fatalf("second up: %v\n%s\nwant a failure saying %q", err, out, want)
	}

	kill()
	startUp(t, dataDir)
}
