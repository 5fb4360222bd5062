package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// runMainEnv makes this test binary run main() instead of the tests, so a
// test can start `dispatch` as a process of its own.
const runMainEnv = "DISPATCH_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	// Where to connect is each test's to say: a developer's nats CLI
	// settings (NATS_URL, which dispatch reads) or an old
	// DISPATCH_NATS_URL must not reach it, nor make the two disagree.
	for _, name := range []string{"NATS_URL", "NATS_USER", "NATS_PASSWORD", "DISPATCH_NATS_URL"} {
		_ = os.Unsetenv(name)
	}
	os.Exit(m.Run())
}

// startUp runs `dispatch up` on dataDir as a process, killed at cleanup,
// waits until it says it is up, and returns its NATS URL.
func startUp(t *testing.T, dataDir string, env ...string) (pid int, url string, kill func()) {
	t.Helper()
	pid, url, kill, _ = startUpOut(t, dataDir, env...)
	return pid, url, kill
}

// startUpOut is startUp that also returns everything the process writes,
// stdout and stderr.
func startUpOut(t *testing.T, dataDir string, env ...string) (pid int, url string, kill func(), out *syncBuffer) {
	t.Helper()
	out = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := upCommand(ctx, dataDir, env...)
	cmd.Stdout, cmd.Stderr = out, out
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
	return cmd.Process.Pid, m[1], kill, out
}

// natsURL finds the URL in up's banner ("  NATS:     nats://…").
var natsURL = regexp.MustCompile(`NATS:\s+(nats://\S+)`)

// upCommand is `dispatch up` on dataDir; env overrides its defaults.
func upCommand(ctx context.Context, dataDir string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "up")
	var base []string
	for _, kv := range os.Environ() {
		// Nor the nats CLI's settings, which dispatch reads too.
		if name, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(kv, "DISPATCH_") && name != "NATS_URL" && name != "NATS_USER" && name != "NATS_PASSWORD" {
			base = append(base, kv)
		}
	}
	cmd.Env = append(base, runMainEnv+"=1", "DISPATCH_DATA_DIR="+dataDir,
		"DISPATCH_NATS_LISTEN=127.0.0.1:-1", "DISPATCH_HTTP_LISTEN=off")
	cmd.Env = append(cmd.Env, env...) // the last of a name wins
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

// `dispatch up` with its review page is ready on /readyz once every service
// consumes and the page serves; it serves the review queue gauge, and every
// service and the page answer micro's discovery.
func TestUpIsReadyAndListsItsServices(t *testing.T) {
	ports := freePorts(t, 2)
	metrics := fmt.Sprintf("127.0.0.1:%d", ports[0])
	_, url, _ := startUp(t, t.TempDir(), "DISPATCH_METRICS_LISTEN="+metrics, fmt.Sprintf("DISPATCH_HTTP_LISTEN=127.0.0.1:%d", ports[1]))
	// "is up" is printed once the API answers; the stages may still bind.
	deadline := time.Now().Add(30 * time.Second) // a deadlock guard
	for {
		code, body := httpGet(t, "http://"+metrics+"/readyz")
		if code == http.StatusOK && body == "ready\n" {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := httpGet(t, "http://"+metrics+"/metrics"); code != http.StatusOK || !strings.Contains(body, `dispatch_review_queue{reason="gated"} 0`) {
		t.Errorf("/metrics = %d without the review queue:\n%s", code, body)
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	want := []string{services.MicroService, services.OpsName("web")}
	for _, s := range mesh.All {
		want = append(want, services.OpsName(s))
	}
	slices.Sort(want)
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$SRV.PING", inbox, nil); err != nil {
		t.Fatal(err)
	}
	var names []string
	for len(names) < len(want) {
		msg, err := sub.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("$SRV.PING answered by %v, want %v: %v", names, want, err)
		}
		var p micro.Ping
		if err := json.Unmarshal(msg.Data, &p); err != nil {
			t.Fatal(err)
		}
		names = append(names, p.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Fatalf("$SRV.PING answered by %v, want %v", names, want)
	}
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(body)
}
