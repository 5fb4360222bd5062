package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// runDispatch runs the dispatch command against url and returns its output
// and exit code.
func runDispatch(t *testing.T, url string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a deadlock guard
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "NATS_URL="+url)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("dispatch %v: %v\n%s", args, err, out)
	}
	return string(out), code
}

// submit -wait prints each stage, then the outcome and the final answer;
// so does status once the task has finished; an invalid task is refused with its problems; the status of a task
// rejected at intake says so and why.
func TestSubmitWaitAndStatus(t *testing.T) {
	_, url, _ := startUp(t, t.TempDir())

	out, code := runDispatch(t, url, "submit", "-id", "cli-1", "-type", "css_fix", "-subject", "src/app.css",
		"-payload", `{"issue":"button misaligned"}`, "-wait", "-timeout", "1m")
	for _, want := range []string{"cli-1\n", "verified", "executed", "succeeded after 1 attempt(s)", "summary: SIMULATED"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("submit -wait exited %d, want %q in:\n%s", code, want, out)
		}
	}

	// The status of a finished task ends with its final answer.
	out, code = runDispatch(t, url, "status", "cli-1")
	for _, want := range []string{"approach: simulated approach for attempt 1", "summary: SIMULATED", "change: simulated change"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("status exited %d, want %q in:\n%s", code, want, out)
		}
	}
	out, code = runDispatch(t, url, "status", "cli-1", "-o", "json")
	if code != 0 || !strings.Contains(out, `"summary": "SIMULATED`) {
		t.Fatalf("status -o json exited %d, want the result in:\n%s", code, out)
	}

	out, code = runDispatch(t, url, "submit", "-type", "css_fix", "-max-retries", "-1")
	if code != 1 || !strings.Contains(out, `"subject" is required; "max_retries" must not be negative`) {
		t.Fatalf("invalid submit exited %d:\n%s", code, out)
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("dispatch.submit.css_fix", []byte(`{"id":"cli-bad","subject":""}`)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		out, code = runDispatch(t, url, "status", "cli-bad")
		if !strings.Contains(out, "not found") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // intake has not read it yet
	}
	if code != 1 || !strings.Contains(out, "task cli-bad was rejected when submitted") || !strings.Contains(out, `"subject" is required`) {
		t.Fatalf("status of a rejected task exited %d:\n%s", code, out)
	}
}
