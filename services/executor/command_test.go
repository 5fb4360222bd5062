package executor_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// agent is the policy of a type run by an agent command given as a shell script.
func agent(script string, timeout time.Duration) policy.Type {
	return policy.Type{Executor: executor.ExecutorCommand, Command: []string{"sh", "-c", script}, CommandTimeout: policy.Duration(timeout)}
}

func TestAgentCommandSuccess(t *testing.T) {
	dir := t.TempDir()
	prompt := filepath.Join(dir, "prompt")
	// the script's $0 is the file it copies its stdin to
	e := newEnv(t, always(ok("unused")), policy.Type{Executor: "command", Command: []string{"sh", "-c",
		`cat > "$0"; echo 'working...'; echo '{"status":"success","approach":"cli fix","summary":"done","tokens_in":7,"tokens_out":3,"model":"gpt-4o"}'`, prompt}}, nil)

	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.Approach != "cli fix" || r.Model != "gpt-4o" || r.TokensIn != 7 || r.TokensOut != 3 || r.Cost != (7*2.5+3*10)/1e6 {
		t.Errorf("result %+v, want the parsed success with the usage it reported, priced", r)
	}
	got, err := os.ReadFile(prompt)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != executor.PromptText(testMessages) {
		t.Errorf("stdin %q, want the prompt as text %q", got, executor.PromptText(testMessages))
	}
	if n := e.model.Calls(); n != 0 {
		t.Errorf("%d model calls, want none", n)
	}
}

func TestAgentCommandFailures(t *testing.T) {
	e := newEnv(t, always(ok("unused")), agent(`echo '{"status":"failure","approach":"x","summary":"could not reproduce"}'`, 0), nil)
	if r := e.handle("t1", 1, testMessages).result(t); r.ErrorClass != events.ErrorClassTask || r.Error != "could not reproduce" || r.Model != "command:sh" {
		t.Errorf("reported failure: %+v", r)
	}

	e = newEnv(t, always(ok("unused")), agent(`cat >/dev/null; echo "provider overloaded" >&2; exit 75`, 0), nil)
	if d := e.handle("t1", 1, testMessages).snooze(t); d != 500*time.Millisecond {
		t.Errorf("exit 75: snooze %v, want the first backoff", d)
	}

	e = newEnv(t, always(ok("unused")), agent(`cat >/dev/null; echo "partial output"; echo "error: unknown flag --frobnicate" >&2; exit 2`, 0), nil)
	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassDeterministic ||
		!strings.Contains(r.Error, "exited with status 2") || !strings.Contains(r.Error, "unknown flag --frobnicate") || !strings.Contains(r.Error, "partial output") {
		t.Errorf("exit 2: %+v, want deterministic with the output's tail", r)
	}
	if r := e.handle("t1", 2, testMessages).result(t); r.ErrorClass != events.ErrorClassRefused {
		t.Errorf("identical prompt after exit 2: %+v, want refused", r)
	}

	e = newEnv(t, always(ok("unused")), agent(`echo "thinking"; exec sleep 60`, 50*time.Millisecond), nil)
	r = e.handle("t1", 1, testMessages).result(t)
	if r.ErrorClass != events.ErrorClassTimeout || !events.ShortCircuits(r.ErrorClass) || !strings.Contains(r.Error, "timed out after 50ms") {
		t.Errorf("timeout: %+v, want class timeout", r)
	}

	e = newEnv(t, always(ok("unused")), agent(`echo "I changed the CSS"`, 0), nil)
	if r := e.handle("t1", 1, testMessages).result(t); r.ErrorClass != events.ErrorClassInvalidOutput {
		t.Errorf("prose on stdout: %+v, want invalid output", r)
	}
}

// pipeline is a type whose "validate" step is a command.
func pipeline(dir string, timeout time.Duration, argv ...string) policy.Type {
	return policy.Type{Steps: []policy.Step{
		{Name: "implement"},
		{Name: "validate", Run: "command", Command: argv, Dir: dir, Timeout: policy.Duration(timeout)},
	}}
}

func TestCommandStep(t *testing.T) {
	e := newEnv(t, always(ok("model step")), pipeline("", 0, "sh", "-c", "echo vet failed: x.go:3; exit 1"), nil)
	validate := events.Run{Pass: 2, Attempt: 1, Step: "validate"}
	r := e.handleRun("t1", validate, nil).result(t)
	if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassStep || r.Error != "vet failed: x.go:3" {
		t.Errorf("result %+v, want a step failure carrying the output", r)
	}
	if n := e.model.Calls(); n != 0 {
		t.Errorf("%d model calls for a command step, want 0", n)
	}
	// a model step of the same pipeline goes to the model
	if r := e.handleRun("t1", events.Run{Pass: 3, Attempt: 1, Step: "implement"}, testMessages).result(t); r.Outcome != events.OutcomeSuccess {
		t.Errorf("model step: %+v", r)
	}
	if n := e.model.Calls(); n != 1 {
		t.Errorf("%d model calls, want 1 for the model step", n)
	}
}

func TestCommandStepRuns(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", 5000)
	tests := []struct {
		name    string
		argv    []string
		timeout time.Duration
		check   func(t *testing.T, r events.Result)
	}{
		{"passes in its dir with the task on stdin", []string{"sh", "-c", "pwd; cat"}, 0, func(t *testing.T, r events.Result) {
			var task events.Task
			lines := strings.SplitN(r.Summary, "\n", 2)
			if r.Outcome != events.OutcomeSuccess || lines[0] != dir || json.Unmarshal([]byte(lines[1]), &task) != nil || task.ID != "t1" {
				t.Errorf("result %+v, want success run in %s with the task JSON on stdin", r, dir)
			}
		}},
		{"long output keeps the tail", []string{"sh", "-c", "echo start; echo " + long + "; echo the real error >&2; exit 3"}, 0, func(t *testing.T, r events.Result) {
			if r.ErrorClass != events.ErrorClassStep || len(r.Error) > executor.MaxErrorOutput+3 ||
				!strings.HasSuffix(r.Error, "the real error") || strings.Contains(r.Error, "start") {
				t.Errorf("error of %d bytes, want the last %d ending with the real error", len(r.Error), executor.MaxErrorOutput)
			}
		}},
		{"silent failure", []string{"false"}, 0, func(t *testing.T, r events.Result) {
			if r.ErrorClass != events.ErrorClassStep || !strings.Contains(r.Error, "exited with status 1") {
				t.Errorf("result %+v, want the exit status as the error", r)
			}
		}},
		{"timeout", []string{"sleep", "60"}, 50 * time.Millisecond, func(t *testing.T, r events.Result) {
			if r.ErrorClass != events.ErrorClassTimeout || !strings.Contains(r.Error, "timed out") {
				t.Errorf("result %+v, want class timeout", r)
			}
		}},
		{"missing binary", []string{"/nonexistent/validator"}, 0, func(t *testing.T, r events.Result) {
			if r.ErrorClass != events.ErrorClassConfig || !strings.Contains(r.Error, "/nonexistent/validator") {
				t.Errorf("result %+v, want a config failure (the deployment's) naming the command", r)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, always(ok("unused")), pipeline(dir, tt.timeout, tt.argv...), nil)
			tt.check(t, e.handleRun("t1", events.Run{Pass: 1, Attempt: 1, Step: "validate"}, nil).result(t))
		})
	}
}

// An agent command, and a command step, get PATH, HOME and the like and
// the names the deployment adds for them — never the executor's secrets
// (its model key, NATS password, state key), whatever the policy runs.
func TestAgentCommandSeesNoSecrets(t *testing.T) {
	t.Setenv("DISPATCH_OPENAI_API_KEY", "sk-secret-model-key")
	t.Setenv("DISPATCH_NATS_PASSWORD", "secret-nats-password")
	t.Setenv("DISPATCH_STATE_KEY", "secret-state-key")
	t.Setenv("AGENT_VENDOR_KEY", "vendor-key")
	out := filepath.Join(t.TempDir(), "env")
	e := newEnv(t, always(ok("unused")), policy.Type{Executor: executor.ExecutorCommand, Command: []string{"sh", "-c",
		`env > "$0"; echo '{"status":"success","approach":"env","summary":"printed"}'`, out}},
		func(c *executor.Config) { c.AgentEnv = []string{"AGENT_VENDOR_*"} })
	if r := e.handle("t1", 1, testMessages).result(t); r.Outcome != events.OutcomeSuccess {
		t.Fatalf("result %+v", r)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	env := string(got)
	for _, secret := range []string{"sk-secret-model-key", "secret-nats-password", "secret-state-key", "DISPATCH_"} {
		if strings.Contains(env, secret) {
			t.Errorf("the agent command saw %q:\n%s", secret, env)
		}
	}
	if !strings.Contains(env, "AGENT_VENDOR_KEY=vendor-key") || !strings.Contains(env, "PATH=") {
		t.Errorf("the agent command lacks PATH or the name its deployment added:\n%s", env)
	}
}

// Each process of an agent command runs under the agent limits, of a
// command step under the command limits: the command itself reports them
// (CPU seconds, memory KiB, open files). A zero limit leaves the resource
// as the executor has it.
func TestCommandsRunUnderTheirLimits(t *testing.T) {
	report := `ulimit -t; ulimit -d; ulimit -n`
	out := filepath.Join(t.TempDir(), "limits")
	limits := func(c *executor.Config) {
		c.AgentLimits = procgroup.Limits{CPU: 30 * time.Second, Memory: 1 << 30, Files: 64}
		c.CommandLimits = procgroup.Limits{CPU: 20 * time.Second, Files: 32} // memory: as the executor has it
	}
	e := newEnv(t, always(ok("unused")), policy.Type{Executor: executor.ExecutorCommand, Command: []string{"sh", "-c",
		"{ " + report + `; } > "$0"; echo '{"status":"success","approach":"ulimit","summary":"printed"}'`, out}}, limits)
	if r := e.handle("t1", 1, testMessages).result(t); r.Outcome != events.OutcomeSuccess {
		t.Fatalf("result %+v", r)
	}
	if got, err := os.ReadFile(out); err != nil || string(got) != "30\n1048576\n64\n" {
		t.Errorf("agent command's limits %q, %v; want 30 s, 1 GiB, 64 files", got, err)
	}

	own, err := exec.Command("sh", "-c", "ulimit -d").Output() // a child's, without limits
	if err != nil {
		t.Fatal(err)
	}
	e = newEnv(t, always(ok("unused")), pipeline("", 0, "sh", "-c", report+"; exit 1"), limits)
	r := e.handleRun("t1", events.Run{Pass: 1, Attempt: 1, Step: "validate"}, nil).result(t)
	if want := "20\n" + string(own) + "32"; r.ErrorClass != events.ErrorClassStep || r.Error != want {
		t.Errorf("command step's limits %q (%s); want %q: 20 s, memory as without limits, 32 files", r.Error, r.ErrorClass, want)
	}
}

// An agent command spinning past its CPU time limit is killed and fails
// deterministically, saying so: the identical prompt is then refused, never
// run again.
func TestAgentCommandOverItsCPULimit(t *testing.T) {
	e := newEnv(t, always(ok("unused")), agent(`cat >/dev/null; echo "thinking hard"; while :; do :; done`, time.Minute),
		func(c *executor.Config) { c.AgentLimits = procgroup.Limits{CPU: time.Second} })
	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassDeterministic ||
		!strings.Contains(r.Error, "used up its CPU time limit of 1s") || !strings.Contains(r.Error, "thinking hard") {
		t.Errorf("result %+v, want deterministic naming the CPU time limit, with the output", r)
	}
	if r := e.handle("t1", 2, testMessages).result(t); r.ErrorClass != events.ErrorClassRefused {
		t.Errorf("identical prompt after the CPU limit: %+v, want refused", r)
	}
}

// A command step killed by a signal fails as the step's, the reason before
// its output; a crash is no deployment fault.
func TestCommandStepKilled(t *testing.T) {
	e := newEnv(t, always(ok("unused")), pipeline("", 0, "sh", "-c", "echo ran 3 tests; kill -SEGV $$"), nil)
	r := e.handleRun("t1", events.Run{Pass: 1, Attempt: 1, Step: "validate"}, nil).result(t)
	if r.ErrorClass != events.ErrorClassStep || !strings.Contains(r.Error, "was killed: signal: segmentation fault") || !strings.HasSuffix(r.Error, "ran 3 tests") {
		t.Errorf("result %+v, want a step failure saying it was killed, then the output", r)
	}
}
