package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// NATS_URL is read like every NATS client reads it; DISPATCH_NATS_URL is
// still honoured; both set to different URLs is an error naming both.
func TestResolveNATSURL(t *testing.T) {
	for _, c := range []struct {
		env       map[string]string
		want, err string
	}{
		{env: nil, want: DefaultNATSURL},
		{env: map[string]string{"NATS_URL": "nats://a:1"}, want: "nats://a:1"},
		{env: map[string]string{"DISPATCH_NATS_URL": "nats://b:2"}, want: "nats://b:2"},
		{env: map[string]string{"NATS_URL": "nats://a:1", "DISPATCH_NATS_URL": "nats://a:1"}, want: "nats://a:1"},
		{env: map[string]string{"NATS_URL": "nats://a:1", "DISPATCH_NATS_URL": "nats://b:2"}, err: "NATS_URL=nats://a:1 and DISPATCH_NATS_URL=nats://b:2 differ"},
	} {
		got, err := resolveNATSURL(func(k string) (string, bool) { v, ok := c.env[k]; return v, ok })
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: got %q, %v; want the error %q", c.env, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v: got %q, %v; want %q", c.env, got, err, c.want)
		}
	}
}

// A -payload that is not JSON is refused before anything is sent, saying
// where and what, in the command line's terms.
func TestSubmitBadPayload(t *testing.T) {
	for _, c := range []struct{ payload, want string }{
		{`{issue: 1}`, `-payload is not JSON at byte 2: invalid character 'i' looking for beginning of object key string`},
		{`{"issue":"x"`, `-payload is not JSON: it ends before the JSON value does`},
		{`button misaligned`, `-payload is not JSON at byte 1: invalid character 'b'`},
		{`{"a":1} {"b":2}`, `-payload is not one JSON value: it goes on after byte 7`},
	} {
		out, code := runDispatch(t, "nats://127.0.0.1:1", "submit", "-type", "css_fix", "-subject", "x", "-payload", c.payload)
		if code != 1 || !strings.Contains(out, c.want) || strings.Contains(out, "MarshalJSON") || strings.Contains(out, "connect") {
			t.Errorf("-payload %s: exited %d, want %q in:\n%s", c.payload, code, c.want, out)
		}
	}
}

// Every command up's banner prints works pasted into a shell as it is, on
// a port that is not the default: the export of the NATS line, the policy
// lines, the nats submit line (which prints the id the wait line asks
// for), the dispatch submit line, the nats wait line, and the client
// API's curl lines (submit, then wait). The nats lines need
// the nats CLI (.ci/run builds it): without it they are skipped, saying
// so, except in CI.
func TestUpBannerLinesWork(t *testing.T) {
	if testing.Short() {
		t.Skip("runs dispatch up and a shell: not with -short")
	}
	_, url, _, out := startUpOut(t, t.TempDir(), "DISPATCH_HTTP_LISTEN=127.0.0.1:0")
	if strings.HasSuffix(url, ":4222") {
		t.Fatalf("up listens on the default port %s: the test needs another", url)
	}
	banner := out.String()
	export := regexp.MustCompile(`\(clients: (export [^)]*)\)`).FindStringSubmatch(banner)
	if export == nil {
		t.Fatalf("no export in the NATS line:\n%s", banner)
	}
	var commands []string
	label := regexp.MustCompile(`^\s+(?:[a-z ]+:\s+)?`)
	for line := range strings.Lines(banner) {
		cmd := strings.TrimSpace(label.ReplaceAllString(line, ""))
		if strings.HasPrefix(cmd, "nats ") || strings.HasPrefix(cmd, "NATS_URL=") || strings.HasPrefix(cmd, "curl ") {
			commands = append(commands, cmd)
		}
	}
	if len(commands) != 7 {
		t.Fatalf("want 7 commands in the banner, found %d: %q\n%s", len(commands), commands, banner)
	}

	// `dispatch` is this test binary, running main.
	bin := t.TempDir()
	wrapper := "#!/bin/sh\n" + runMainEnv + "=1 exec '" + os.Args[0] + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "dispatch"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	path := bin + string(os.PathListSeparator) + os.Getenv("PATH")
	natsCLI := ""
	if p, err := exec.LookPath("nats"); err == nil {
		natsCLI = p
	} else if home, err := os.UserCacheDir(); err == nil {
		if p := filepath.Join(home, "dispatchmesh", "natscli-v0.4.0", "nats"); fileExists(p) {
			natsCLI = p
		}
	}
	if natsCLI != "" {
		path = filepath.Dir(natsCLI) + string(os.PathListSeparator) + path
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DISPATCH_") && !strings.HasPrefix(kv, "NATS_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+path)
	dir := t.TempDir()
	shell := func(line string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a deadlock guard
		defer cancel()
		cmd := exec.CommandContext(ctx, "sh", "-c", line)
		cmd.Env, cmd.Dir = env, dir
		b, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		return string(b), code
	}

	// The export makes the dispatch commands find the mesh.
	if got, code := shell(export[1] + "; dispatch tasks"); code != 0 {
		t.Fatalf("%s; dispatch tasks: exited %d\n%s", export[1], code, got)
	}
	wants := []string{"", "", `"id":"` + bannerTaskID + `"`, "succeeded after 1 attempt(s)", `"status":"succeeded"`,
		`"id":"` + bannerHTTPTaskID + `"`, `"status":"succeeded"`}
	for i, line := range commands {
		if strings.HasPrefix(line, "nats ") && natsCLI == "" {
			if os.Getenv("CI") != "" {
				t.Fatalf("no nats CLI (in PATH or the cache .ci/run builds it in) to run %s", line)
			}
			t.Logf("SKIPPED (no nats CLI): %s", line)
			continue
		}
		got, code := shell(line)
		if code != 0 || !strings.Contains(got, wants[i]) {
			t.Fatalf("%s\nexited %d, want %q in:\n%s", line, code, wants[i], got)
		}
		t.Logf("ran: %s", line)
	}
	if !fileExists(filepath.Join(dir, "policy.json")) {
		t.Fatal("the policy get line wrote no policy.json")
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// The same id submitted again with another body is refused, saying what
// differs; with the same body it is the same task.
func TestSubmitConflict(t *testing.T) {
	_, url, _ := startUp(t, t.TempDir())
	args := []string{"submit", "-id", "cli-409", "-type", "css_fix", "-subject", "src/app.css", "-payload", `{"issue":"a"}`}
	if out, code := runDispatch(t, url, append(args, "-wait")...); code != 0 {
		t.Fatalf("submit: exited %d\n%s", code, out)
	}
	if out, code := runDispatch(t, url, args...); code != 0 || !strings.Contains(out, "cli-409") {
		t.Fatalf("the same again: exited %d\n%s", code, out)
	}
	out, code := runDispatch(t, url, "submit", "-id", "cli-409", "-type", "css_fix", "-subject", "src/app.css", "-payload", `{"issue":"b"}`)
	if code != 1 || !strings.Contains(out, `exists and was submitted with another body ("payload" differs at .issue)`) || !strings.Contains(out, "(409)") {
		t.Fatalf("another body: exited %d, want the 409 naming the payload:\n%s", code, out)
	}
}
