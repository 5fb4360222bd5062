package procgroup

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// WaitDelay is how long a run waits, after its command was killed or
// exited, for the output pipes to close (a grandchild that left the process
// group may hold them) before giving up on them.
const WaitDelay = time.Second

// DefaultEnv are the environment variables every command gets from the
// service that runs it (a name ending in * is a prefix): what a program
// needs to find its tools, its home and its locale — never the service's
// secrets (its model API key, NATS password, state key), which would
// otherwise be inherited by any command a policy names.
var DefaultEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR", "TERM"}

// Environ is the service's environment cut to DefaultEnv and the names in
// extra (a name ending in * is a prefix): the whole environment a command
// gets.
func Environ(extra []string) []string {
	allow := slices.Concat(DefaultEnv, extra)
	env := []string{}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if slices.ContainsFunc(allow, func(a string) bool {
			prefix, wild := strings.CutSuffix(a, "*")
			return name == a || (wild && strings.HasPrefix(name, prefix))
		}) {
			env = append(env, kv)
		}
	}
	return env
}

// Command prepares argv (non-empty) to run in dir with stdin as its input,
// in its own process group, killed with its children when ctx ends, with
// the environment Environ(extraEnv) — DefaultEnv and the names extraEnv
// adds, nothing else of the service's — and every process of it under the
// resource limits lim, in force before its own code runs (on Linux). A
// limited command starts as the running binary, which sets the limits and
// execs argv in its place; a command that then cannot be run exits 127
// (not found) or 126, as from a shell, saying why on stderr. The caller
// sets Stdout and Stderr.
func Command(ctx context.Context, argv []string, dir string, stdin []byte, extraEnv []string, lim Limits) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	limit(cmd, lim)
	cmd.Env = Environ(extraEnv)
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.WaitDelay = WaitDelay
	KillOnCancel(cmd)
	return cmd
}

// Run runs cmd (made by Command) to its end. A child the command left
// running behind it, holding its output open past WaitDelay, is killed with
// what is left of the group (which it keeps alive, so the group id is still
// theirs), and does not turn the command's own success into an error: a
// command that exited 0 succeeded (its children's output past the exit is
// lost). A command killed at its CPU time limit fails with an error that
// is ErrCPULimit (errors.Is) and wraps the *exec.ExitError.
func Run(cmd *exec.Cmd) error {
	err := cmd.Run()
	if !errors.Is(err, exec.ErrWaitDelay) {
		return cpuLimited(err)
	}
	KillGroup(cmd)
	if cmd.ProcessState != nil && cmd.ProcessState.Success() {
		return nil
	}
	return cpuLimited(err)
}
