package examples_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
)

// patience bounds every wait: a deadlock guard, not a timing assertion.
const patience = 2 * time.Minute

// badTask is invalid twice over: every example must show both problems.
const badTask = `{"type":"css_fix","max_retries":-1}`

// TestExamplesInterop runs every example as a user would, twice. Each must
// see its task succeed, and the clear validation error of a bad task.
//
// First against `dispatch up` (embedded NATS on a free port, no auth, a
// temp data dir, a fake OpenAI-compatible model that calls the type's
// tool): the JavaScript verifier and tool run as micro services, and every
// task goes through them.
//
// Then against the deployment as shipped: nats-server loaded from
// deploy/nats/single.conf and users.conf, `dispatch provision` as admin,
// every service as `dispatch <service>` under its own user (the SIMULATED
// model: no API key), and the submitting examples as the untrusted client
// user, given NATS_USER, NATS_PASSWORD and NATS_INBOX_PREFIX.
//
// Outside CI an example whose toolchain is missing is skipped, saying so;
// in CI (CI set, as .ci/run does) it fails.
func TestExamplesInterop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs programs: not with -short")
	}
	start := time.Now()
	natsServer, dispatch := proctest.Build(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "github.com/dispatchmesh/dispatchmesh/examples/go")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built nats-server, dispatch and the Go example in %s", time.Since(start).Round(time.Millisecond))

	node := toolchain("node", "js/node_modules/nats/package.json")
	submitters := []example{
		{"cli", toolchain("nats", ""), []string{"sh", "cli/submit.sh"}, nil},
		{"js", node, []string{"node", "js/submit.mjs"}, nil},
		{"c", toolchain("cc", "/usr/include/nats/nats.h"), []string{filepath.Join(bin, "submit-c")},
			[]string{"cc", "-Wall", "-Werror", "-o", filepath.Join(bin, "submit-c"), "c/submit.c", "-lnats"}},
		{"go", tc{}, []string{filepath.Join(bin, "go")}, nil},
		// Over HTTP, the client API: no NATS client at all.
		{"curl", toolchain("curl", ""), []string{"sh", "curl/submit.sh"}, nil},
		{"python", toolchain("python3", ""), []string{"python3", "python/submit.py"}, nil},
	}

	t.Run("up", func(t *testing.T) {
		begun := time.Now()
		model := fakeModel(t)
		policy := `{}`
		if node.missing == "" {
			policy = `{"types": {"css_fix": {
				"verifier": {"kind": "nats", "subject": "verify.css_fix", "timeout": "30s"},
				"tools": [{"name": "lookup_selector", "subject": "tool.css.lookup", "description": "Find where a CSS selector is defined",
					"parameters": {"type": "object", "properties": {"selector": {"type": "string"}}, "required": ["selector"]}}]}}}`
		}
		url, api := startUp(t, dispatch, model.URL+"/v1", policy)
		t.Logf("dispatch up at %s after %s", url, time.Since(begun).Round(time.Millisecond))
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		c, err := client.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		m := target{url: url, answer: "aligned the button", vars: apiVars(api)}

		// The JavaScript verifier and tool: every css_fix task goes through them.
		if node.missing == "" {
			for _, prog := range []string{"verifier.mjs", "tool.mjs"} {
				background(t, m.env(), "js", "node", prog)
			}
			waitServices(t, nc, "css_verifier", "css_tools")
			m.succeeded = func(t *testing.T, id, out string) { throughJS(t, c, id, out) }
		}
		runExamples(t, m, submitters)
		conflict(t, m)

		// The JavaScript verifier can also say a problem is gone: the task is
		// cancelled before any model call.
		if node.missing == "" {
			out, code := run(t, m.env(), "node", "js/submit.mjs", `{"type":"css_fix","subject":"src/done.fixed.css"}`)
			if code != 1 || !strings.Contains(out, "cancelled") {
				t.Fatalf("a stale task: exited %d, want it cancelled:\n%s", code, out)
			}
		}
	})

	// The default policy has no verifier or tools for css_fix: the
	// JavaScript ones do not run here.
	t.Run("deployed", func(t *testing.T) {
		begun := time.Now()
		m := startDeployed(t, natsServer, dispatch)
		t.Logf("the deployment at %s after %s", m.url, time.Since(begun).Round(time.Millisecond))
		runExamples(t, m, submitters)
		conflict(t, m)
	})
	t.Logf("interop test took %s", time.Since(start).Round(time.Millisecond))
}

// example is a submitting example: the toolchain it needs, how to run it
// (in examples/; the task is appended when one is given) and, when set, a
// command to run first (a compiler).
type example struct {
	name    string
	tc      tc
	argv    []string
	prepare []string
}

// target is a running mesh the examples submit to.
type target struct {
	url string
	// vars are the examples' settings besides NATS_URL (NATS_USER, …).
	vars []string
	// answer is what the printed answer of a task must say ("": anything).
	answer string
	// succeeded, when set, checks a task that succeeded further.
	succeeded func(t *testing.T, id, out string)
	// running are the mesh's processes, which must not exit.
	running map[string]*proctest.Process
}

// env is the environment of the examples run against m.
func (m target) env() []string { return append(env(m.url), m.vars...) }

// runExamples runs each example, as a subtest, against m: a task must
// succeed with its answer printed, a bad task must show both its problems.
func runExamples(t *testing.T, m target, examples []example) {
	t.Helper()
	for _, ex := range examples {
		t.Run(ex.name, func(t *testing.T) {
			if ex.tc.missing != "" {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s is missing: .ci/run installs it", ex.tc.missing)
				}
				t.Skipf("%s is missing: skipped (.ci/run installs it; CI fails without it)", ex.tc.missing)
			}
			begun := time.Now()
			if ex.prepare != nil {
				if out, code := run(t, m.env(), ex.prepare...); code != 0 {
					t.Fatalf("%v exited %d:\n%s", ex.prepare, code, out)
				}
			}
			out, code := run(t, m.env(), ex.argv...)
			proctest.CheckRunning(t, m.running)
			if code != 0 || !strings.Contains(out, "succeeded") || !strings.Contains(out, m.answer) {
				t.Fatalf("the example exited %d, want its task to succeed and its answer printed:\n%s", code, out)
			}
			id := submitted.FindStringSubmatch(out)
			if id == nil {
				t.Fatalf("the example did not say which task it submitted:\n%s", out)
			}
			if m.succeeded != nil {
				m.succeeded(t, id[1], out)
			}

			out, code = run(t, m.env(), append(ex.argv, badTask)...)
			plain := strings.ReplaceAll(out, `\"`, `"`) // the CLI prints the JSON answer
			if code == 0 || !strings.Contains(plain, `"subject" is required`) || !strings.Contains(plain, `"max_retries" must not be negative`) {
				t.Fatalf("a bad task: the example exited %d, want the validation error:\n%s", code, out)
			}
			t.Logf("%s: ran in %s", ex.name, time.Since(begun).Round(time.Millisecond))
		})
	}
}

// startDeployed runs the deployment as deploy/ ships it, until the test
// ends: nats-server from deploy/nats (single.conf, users.conf) with fresh
// passwords, `dispatch provision` as admin, every service under its own
// user. It returns it once the API answers the client user, with that
// user's settings for the examples.
func startDeployed(t *testing.T, natsServer, dispatch string) target {
	t.Helper()
	pw := proctest.SetPasswords(t)
	url := proctest.StartNATS(t, natsServer, filepath.Join(proctest.Root(t), "deploy", "nats"), 0).URL
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	admin, err := nats.Connect(url, nats.UserInfo("admin", pw["admin"]))
	if err != nil {
		t.Fatalf("connect as admin: %v", err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, patience, "JetStream", func() error { _, err := js.AccountInfo(ctx); return err })

	as := func(user string) []string {
		return proctest.Env("NATS_URL="+url, "DISPATCH_NATS_USER="+user, "DISPATCH_NATS_PASSWORD="+pw[user])
	}
	if out := proctest.RunToEnd(t, patience, "provision", as("admin"), dispatch, "provision"); !strings.Contains(out, "provisioned:") {
		t.Fatalf("dispatch provision said:\n%s", out)
	}
	running := map[string]*proctest.Process{}
	for _, name := range mesh.All {
		running[name] = proctest.Start(t, name, as(name), dispatch, name)
	}

	// Ready once intake's API answers the client user.
	const inbox = "_INBOX.client"
	nc, err := nats.Connect(url, nats.UserInfo("client", pw["client"]), nats.CustomInboxPrefix(inbox))
	if err != nil {
		t.Fatalf("connect as client: %v", err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, patience, "the API", func() error {
		proctest.CheckRunning(t, running)
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // then look at the services again
		defer cancel()
		if _, err := c.Status(ctx, "nothing-yet"); !errors.Is(err, client.ErrNotFound) {
			return fmt.Errorf("status of an unknown task: %v", err)
		}
		return nil
	})
	// The client HTTP API: `dispatch web` as the web user, a client token
	// of its own.
	web := proctest.Start(t, "web", append(as("web"), "DISPATCH_HTTP_LISTEN=127.0.0.1:0",
		"DISPATCH_HTTP_TOKEN=interop-reviewers", "DISPATCH_HTTP_CLIENT_TOKEN="+apiToken), dispatch, "web")
	running["web"] = web
	var api string
	proctest.WaitFor(t, patience, "dispatch web", func() error {
		proctest.CheckRunning(t, running)
		m := webAPI.FindStringSubmatch(web.Output())
		if m == nil {
			return errors.New("no client API address printed yet")
		}
		api = m[1]
		return nil
	})
	vars := append([]string{"NATS_USER=client", "NATS_PASSWORD=" + pw["client"], "NATS_INBOX_PREFIX=" + inbox}, apiVars(api)...)
	return target{url: url, running: running, vars: vars}
}

// apiToken is the client API's token in this test.
const apiToken = "interop-client-token"

// apiVars are the HTTP examples' settings for the client API at url.
func apiVars(url string) []string {
	return []string{"DISPATCH_API_URL=" + url, "DISPATCH_API_TOKEN=" + apiToken}
}

// webAPI finds the client API's address `dispatch web` prints.
var webAPI = regexp.MustCompile(`client API: (http://\S+)`)

// conflict: the same id submitted again with another body is answered
// 409 naming what differs (over HTTP, with curl), after Python submitted
// it.
func conflict(t *testing.T, m target) {
	t.Run("conflict", func(t *testing.T) {
		for _, c := range []string{"python3", "curl"} {
			if toolchain(c, "").missing != "" {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s is missing: .ci/run installs it", c)
				}
				t.Skipf("%s is missing: skipped", c)
			}
		}
		id := "interop-409-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		out, code := run(t, m.env(), "python3", "python/submit.py", `{"id":"`+id+`","type":"css_fix","subject":"src/app.css"}`)
		if code != 0 || !strings.Contains(out, "succeeded") {
			t.Fatalf("python: exited %d:\n%s", code, out)
		}
		out, code = run(t, m.env(), "sh", "curl/submit.sh", `{"id":"`+id+`","type":"css_fix","subject":"src/other.css"}`)
		if code != 1 || !strings.Contains(out, "409 ") || !strings.Contains(out, `\"subject\" differs: the task has \"src/app.css\", this submission \"src/other.css\"`) {
			t.Fatalf("another body under the same id: exited %d, want the 409 naming the subject:\n%s", code, out)
		}
	})
}

// submitted finds the id an example printed: "submitted <id>, waiting".
var submitted = regexp.MustCompile(`submitted ([A-Za-z0-9_-]+), waiting`)

// tc is a toolchain: what is missing of it, "" when it is all there.
type tc struct{ missing string }

// toolchain checks that command is on PATH and file (relative to examples/
// or absolute) exists.
func toolchain(command, file string) tc {
	if _, err := exec.LookPath(command); err != nil {
		return tc{missing: "the command " + command}
	}
	if file != "" {
		if _, err := os.Stat(file); err != nil {
			return tc{missing: file}
		}
	}
	return tc{}
}

// throughJS checks the task went through the JavaScript verifier and that
// the model's call to the JavaScript tool was answered.
func throughJS(t *testing.T, c *client.Client, id, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var verified events.Verified
	var executed events.Executed
	err := c.Watch(ctx, id, func(e client.Event) bool {
		switch e.Stage {
		case events.StageVerified:
			_ = e.Decode(&verified)
		case events.StageExecuted:
			_ = e.Decode(&executed)
		}
		final, _ := e.Final()
		return !final
	})
	if err != nil {
		t.Fatalf("watch %s: %v", id, err)
	}
	if v := verified.Verification; v.Verifier != "nats" || v.Verdict != events.VerdictExists || !strings.Contains(v.Detail, "JavaScript verifier") {
		t.Errorf("task %s was verified by %+v, not the JavaScript verifier", id, v)
	}
	if executed.Result.ToolCalls != 1 || !strings.Contains(out, "the JavaScript tool") {
		t.Errorf("task %s: %d tool calls, and the answer does not quote the JavaScript tool:\n%s", id, executed.Result.ToolCalls, out)
	}
}

// env is the environment of the programs: this one's, without DISPATCH_*
// and NATS_* settings (the users' passwords among them), with NATS_URL.
func env(url string) []string {
	var e []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DISPATCH_") && !strings.HasPrefix(kv, "NATS_") {
			e = append(e, kv)
		}
	}
	return append(e, "NATS_URL="+url)
}

// run runs argv in examples/ with environment env and returns its output
// and exit code.
func run(t *testing.T, env []string, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	cmd := procgroup.Command(ctx, argv, ".", nil, nil, procgroup.Limits{})
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%v did not end in %s:\n%s", argv, patience, out)
	case err == nil:
		return string(out), 0
	case asExit(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("%v: %v\n%s", argv, err, out)
	return "", 0
}

func asExit(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*ee = e
	return ok
}

// background runs argv in dir with environment env until the test ends.
func background(t *testing.T, env []string, dir string, argv ...string) *lockedBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := procgroup.Command(ctx, argv, dir, nil, nil, procgroup.Limits{})
	cmd.Env = env
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("%v: %v", argv, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("%v printed:\n%s", argv, out.String())
		}
	})
	return out
}

// startUp runs `dispatch up` until the test ends and returns its NATS URL
// and its client HTTP API's once it says it is up.
func startUp(t *testing.T, dispatch, modelURL, policy string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policyFile, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := procgroup.Command(ctx, []string{dispatch, "up"}, dir, nil, nil, procgroup.Limits{})
	cmd.Env = append(env(""), "DISPATCH_NATS_LISTEN=127.0.0.1:-1", "DISPATCH_DATA_DIR="+filepath.Join(dir, "data"),
		"DISPATCH_HTTP_LISTEN=127.0.0.1:0", "DISPATCH_HTTP_CLIENT_TOKEN="+apiToken, "DISPATCH_POLICY_FILE="+policyFile,
		"DISPATCH_OPENAI_BASE_URL="+modelURL, "DISPATCH_OPENAI_API_KEY=interop", "DISPATCH_MODEL=fake")
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("dispatch up printed:\n%s", out.String())
		}
	})
	deadline := time.Now().Add(patience)
	for {
		if m := upURL.FindStringSubmatch(out.String()); m != nil && strings.Contains(out.String(), " is up") {
			a := upAPI.FindStringSubmatch(out.String())
			if a == nil {
				t.Fatalf("dispatch up printed no client API address:\n%s", out.String())
			}
			return m[1], a[1]
		}
		select {
		case <-done:
			t.Fatalf("dispatch up exited:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dispatch up never came up:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var (
	upURL = regexp.MustCompile(`NATS:\s+(nats://\S+)`)
	upAPI = regexp.MustCompile(`api:\s+(http://\S+)`)
)

// waitServices waits until each named micro service answers a ping.
func waitServices(t *testing.T, nc *nats.Conn, names ...string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for _, name := range names {
		for {
			if _, err := nc.Request("$SRV.PING."+name, nil, time.Second); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("micro service %s never answered", name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// fakeModel is an OpenAI-compatible endpoint: offered tools, it first calls
// the first one; then, or without tools, it answers a success whose
// summary quotes what the tool said.
func fakeModel(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model    string `json:"model"`
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
			Tools []struct {
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			} `json:"tools"`
		}
		if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, `{"error":{"message":"not a chat completion"}}`, http.StatusNotFound)
			return
		}
		toolSaid := ""
		for _, m := range req.Messages {
			if m.Role == "tool" {
				toolSaid = m.Content
			}
		}
		msg := map[string]any{"role": "assistant"}
		if len(req.Tools) > 0 && toolSaid == "" {
			msg["content"] = ""
			msg["tool_calls"] = []map[string]any{{"id": "call_1", "type": "function",
				"function": map[string]any{"name": req.Tools[0].Function.Name, "arguments": `{"selector":".btn"}`}}}
		} else {
			summary := "aligned the button"
			if toolSaid != "" {
				summary += "; the tool said " + toolSaid
			}
			content, _ := json.Marshal(map[string]any{"status": "success", "approach": "move the rule",
				"summary": summary, "changes": []string{"src/app.css"}})
			msg["content"] = string(content)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-interop", "object": "chat.completion", "created": 1700000000, "model": req.Model,
			"choices": []map[string]any{{"index": 0, "finish_reason": "stop", "message": msg}},
			"usage":   map[string]any{"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
		})
	}))
	t.Cleanup(srv.Close)
	return srv
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
