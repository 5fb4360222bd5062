package deploy_test

// The deployment as it runs: nats-server built from the module and loaded
// with nats/single.conf and nats/users.conf, `dispatch provision` as admin,
// and every service as `dispatch <service>` under its own user, each a
// subprocess. Nothing here is a hand-written imitation of a service.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"dispatchmesh/events"
	"dispatchmesh/internal/mesh"
	"dispatchmesh/internal/procgroup"
	"dispatchmesh/services"
	"dispatchmesh/services/intake"
)

// patience bounds every wait on the processes. It is a deadlock guard, not a
// timing assertion.
const patience = 45 * time.Second

// Every service runs as its own user from users.conf against a server
// loaded from single.conf; tasks submitted with `dispatch submit -wait` and
// through the submit API succeed end to end, and the status API answers. A
// user is refused what is not its own: the server's refusal reaches the
// error handler, and `dispatch` run under the wrong user exits naming it.
func TestServicesRunAsTheirUsers(t *testing.T) {
	natsServer, dispatch := buildBinaries(t)
	pw := setPasswords(t)
	url := startNATS(t, natsServer)
	admin := connect(t, url, "admin", pw["admin"], "")
	waitFor(t, "JetStream", func() error { _, err := admin.js.AccountInfo(context.Background()); return err })

	as := func(user string) []string {
		return dispatchEnv("DISPATCH_NATS_URL="+url, "DISPATCH_NATS_USER="+user, "DISPATCH_NATS_PASSWORD="+pw[user])
	}
	if out := runToEnd(t, "provision", as("admin"), dispatch, "provision"); !strings.Contains(out, "provisioned:") {
		t.Fatalf("dispatch provision said:\n%s", out)
	}

	running := map[string]*process{}
	for _, name := range mesh.All {
		running[name] = startProcess(t, name, as(name), dispatch, name)
	}

	// The wrong user: gate may not read the history the prompt builder
	// needs, the verifier may not serve intake's API. Each exits at start
	// and says which permission is missing.
	wrong := []struct {
		name, user, service, want string
	}{
		{"prompt-as-gate", "gate", mesh.Prompt,
			`permission denied for $JS.API.STREAM.INFO.KV_dispatch_history: NATS user "gate" may not use bucket dispatch_history`},
		{"intake-as-verifier", "verifier", mesh.Intake, `NATS user "verifier" may not subscribe to it`},
	}
	var misfits []*process
	for _, w := range wrong {
		misfits = append(misfits, startProcess(t, w.name, as(w.user), dispatch, w.service))
	}

	// Tasks, submitted as the client user: three with the CLI, one through
	// the micro API.
	var submits []*process
	for i := range 3 {
		submits = append(submits, startProcess(t, fmt.Sprintf("submit-%d", i), as("client"), dispatch,
			"submit", "-id", fmt.Sprintf("e2e-%d", i), "-type", "css_fix", "-subject", fmt.Sprintf("src/app%d.css", i),
			"-payload", `{"issue":"button misaligned"}`, "-wait", "-timeout", patience.String()))
	}
	client := connect(t, url, "client", pw["client"], "_INBOX.client")
	var reply intake.SubmitReply
	waitFor(t, "the submit API", func() error {
		checkRunning(t, running)
		msg, err := client.nc.Request(events.SubmitAPI, []byte(`{"id":"e2e-api","type":"css_fix","subject":"src/api.css"}`), 10*time.Second)
		if errors.Is(err, nats.ErrNoResponders) { // intake not subscribed yet
			return err
		}
		if err != nil {
			t.Fatalf("request %s: %v", events.SubmitAPI, err)
		}
		if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
			t.Fatalf("submit API answered %s %s", code, msg.Header.Get(micro.ErrorHeader))
		}
		return json.Unmarshal(msg.Data, &reply)
	})
	if reply.ID != "e2e-api" {
		t.Fatalf("submit API answered id %q", reply.ID)
	}

	for _, p := range submits {
		out := p.wait(t, running)
		if p.err != nil || !strings.Contains(out, events.StageSucceeded) {
			t.Fatalf("%s: %v\n%s", p.name, p.err, out)
		}
	}
	waitFor(t, "e2e-api to succeed (status API)", func() error {
		checkRunning(t, running)
		msg, err := client.nc.Request(intake.StatusAPI, []byte("e2e-api"), 10*time.Second)
		if err != nil {
			t.Fatalf("request %s: %v", intake.StatusAPI, err)
		}
		var st events.TaskState
		if err := json.Unmarshal(msg.Data, &st); err != nil {
			t.Fatalf("status API answered %q: %v", msg.Data, err)
		}
		if st.Status != events.StatusSucceeded {
			return fmt.Errorf("status %s", st.Status)
		}
		return nil
	})
	// The wait API, as the client: intake watches the task's state and
	// listens for its rejection with its own user's grants.
	msg, err := client.nc.Request(intake.WaitAPI, []byte(`{"id":"e2e-api","timeout":"5s"}`), 10*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", intake.WaitAPI, err)
	}
	var waited events.WaitReply
	if err := json.Unmarshal(msg.Data, &waited); err != nil || waited.Status != events.StatusSucceeded || waited.Result == nil {
		t.Fatalf("wait API answered %s: %v", msg.Data, err)
	}
	if out := runToEnd(t, "status", as("client"), dispatch, "status", "e2e-0"); !strings.Contains(out, string(events.StatusSucceeded)) {
		t.Fatalf("dispatch status e2e-0:\n%s", out)
	}

	for i, p := range misfits {
		out := p.wait(t, running)
		if p.err == nil || !strings.Contains(out, wrong[i].want) || strings.Contains(out, "dispatch provision") {
			t.Errorf("%s exited with %v, want a failure naming %q:\n%s", p.name, p.err, wrong[i].want, out)
		}
	}

	// The gate's user, on a connection of its own: the refusals reach the
	// error handler.
	gate := connect(t, url, "gate", pw["gate"], "_INBOX.gate")
	gate.denyPublish(t, events.SubmitSubject("x"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // how long the refused call waits
	defer cancel()
	if _, err := gate.js.KeyValue(ctx, services.BucketHistory); err == nil {
		t.Fatal("gate bound the history bucket")
	}
	gate.waitViolation(t, "Publish", "$JS.API.STREAM.INFO.KV_"+services.BucketHistory)
	gate.noViolations(t)

	// Every service is still running on its own durable and was refused
	// nothing.
	checkRunning(t, running)
	for _, name := range mesh.All {
		p := running[name]
		stream := services.Stream
		if name == mesh.Reaper {
			stream = services.AdvisoryStream
		}
		if _, err := admin.js.Consumer(context.Background(), stream, name); err != nil {
			t.Errorf("consumer %s on %s: %v", name, stream, err)
		}
		if out := p.output(); strings.Contains(strings.ToLower(out), "permission") {
			t.Errorf("%s was refused something:\n%s", name, out)
		}
	}
}

// buildBinaries builds nats-server (the module's dependency) and dispatch.
func buildBinaries(t *testing.T) (natsServer, dispatch string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "github.com/nats-io/nats-server/v2", "dispatchmesh/cmd/dispatch")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "nats-server"), filepath.Join(dir, "dispatch")
}

// startNATS runs nats-server with single.conf and users.conf as they are,
// but on random loopback ports with the store in a temp dir, and returns its
// client URL.
func startNATS(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	conf := readFile(t, filepath.Join("nats", "single.conf"))
	for _, r := range [][2]string{
		{"listen: 0.0.0.0:4222", "listen: 127.0.0.1:-1"},
		{"http: 0.0.0.0:8222", "http: 127.0.0.1:-1"},
		{`store_dir: "/data/jetstream"`, fmt.Sprintf("store_dir: %q", filepath.Join(dir, "jetstream"))},
	} {
		if !strings.Contains(conf, r[0]) {
			t.Fatalf("single.conf no longer has %q: update this test", r[0])
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	conf += fmt.Sprintf("\n# test: where the random ports are written\nports_file_dir: %q\n", dir)
	for name, text := range map[string]string{"single.conf": conf, "users.conf": readFile(t, filepath.Join("nats", "users.conf"))} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := startProcess(t, "nats-server", os.Environ(), bin, "-c", filepath.Join(dir, "single.conf"))
	var ports struct{ Nats []string }
	waitFor(t, "nats-server's ports file", func() error {
		select {
		case <-p.done:
			t.Fatalf("nats-server exited: %v\n%s", p.err, p.output())
		default:
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.ports"))
		if len(files) == 0 {
			return errors.New("no ports file")
		}
		data, err := os.ReadFile(files[0])
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, &ports); err != nil || len(ports.Nats) == 0 {
			return fmt.Errorf("ports file %q: %v", data, err) // still being written
		}
		return nil
	})
	return ports.Nats[0]
}

// dispatchEnv is this process's environment without DISPATCH_ and
// NATS_PASSWORD_ variables, plus vars.
func dispatchEnv(vars ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DISPATCH_") && !strings.HasPrefix(kv, "NATS_PASSWORD_") {
			env = append(env, kv)
		}
	}
	return append(env, vars...)
}

// waitFor polls cond until it returns nil.
func waitFor(t *testing.T, what string, cond func() error) {
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

// process is a subprocess in its own process group, killed with its
// children at cleanup.
type process struct {
	name string
	done chan struct{} // closed when it has exited; err is then Wait's result
	err  error
	mu   sync.Mutex
	out  bytes.Buffer
}

func (p *process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func startProcess(t *testing.T, name string, env []string, argv ...string) *process {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &process{name: name, done: make(chan struct{})}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = p, p
	cmd.WaitDelay = procgroup.WaitDelay
	procgroup.KillOnCancel(cmd)
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
		if t.Failed() {
			t.Logf("--- %s (%v):\n%s", name, p.err, p.output())
		}
	})
	return p
}

// checkRunning fails the test when a service has exited.
func checkRunning(t *testing.T, running map[string]*process) {
	t.Helper()
	for name, s := range running {
		select {
		case <-s.done:
			t.Fatalf("service %s exited: %v\n%s", name, s.err, s.output())
		default:
		}
	}
}

// wait waits for p to exit and returns its output; a service of running
// that exits first fails the test.
func (p *process) wait(t *testing.T, running map[string]*process) string {
	t.Helper()
	timeout := time.After(patience)
	for {
		checkRunning(t, running)
		select {
		case <-p.done:
			return p.output()
		case <-timeout:
			t.Fatalf("%s did not finish:\n%s", p.name, p.output())
		case <-time.After(100 * time.Millisecond): // look at the services again
		}
	}
}

// runToEnd runs dispatch to its end and returns its output; it must succeed.
func runToEnd(t *testing.T, name string, env []string, argv ...string) string {
	t.Helper()
	p := startProcess(t, name, env, argv...)
	out := p.wait(t, nil)
	if p.err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv[1:], " "), p.err, out)
	}
	return out
}
