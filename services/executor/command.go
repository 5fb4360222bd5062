package executor

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
)

// DefaultCommandTimeout bounds an agent command or a command step when the
// policy sets no timeout.
const DefaultCommandTimeout = 10 * time.Minute

// CommandWaitDelay is how long a run waits, after its command was killed or
// exited, for the output pipes to close (a grandchild that left the process
// group may hold them) before giving up on them.
const CommandWaitDelay = procgroup.WaitDelay

// maxStdout is how much of an agent command's stdout is kept for
// ParseResult: the last bytes, where the structured result is printed.
const maxStdout = 1 << 20

// commandRun is the outcome of one command run.
type commandRun struct {
	stdout string // tail, maxStdout bytes
	output string // combined stdout and stderr, tail MaxErrorOutput bytes
	stderr string // tail, MaxErrorOutput bytes
}

// runCommand runs argv in dir with stdin, the environment
// procgroup.Environ(env) (the default names and those env adds) and each
// process under lim, killing its process group after timeout (default
// DefaultCommandTimeout). A nil error means exit 0; a run that failed
// returns a *CommandError, except when ctx itself ended (shutdown): then
// ctx.Err().
//
// With separate false, stdout and stderr share one pipe, so the combined
// output keeps the order the command wrote it in (a validator's output); with
// true they are read apart, for an agent whose stdout carries the result.
func runCommand(ctx context.Context, argv []string, dir string, stdin []byte, env []string, lim procgroup.Limits, timeout time.Duration, separate bool) (commandRun, error) {
	if timeout <= 0 {
		timeout = DefaultCommandTimeout
	}
	if len(argv) == 0 {
		return commandRun{}, &CommandError{ExitCode: -1, Err: errors.New("no command configured")}
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := procgroup.Command(cctx, argv, dir, stdin, env, lim)
	stdout, stderr, combined := &tailBuffer{max: maxStdout}, &tailBuffer{max: MaxErrorOutput}, &tailBuffer{max: MaxErrorOutput}
	if separate {
		cmd.Stdout = teeWriter{stdout, combined}
		cmd.Stderr = teeWriter{stderr, combined}
	} else {
		cmd.Stdout, cmd.Stderr = combined, combined // one pipe: the order is kept
	}
	err := procgroup.Run(cmd)
	run := commandRun{stdout: stdout.String(), stderr: stderr.String(), output: combined.String()}
	if err == nil {
		return run, nil
	}
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	ce := &CommandError{Argv: argv, ExitCode: -1, Timeout: timeout, Output: strings.TrimSpace(run.output), Err: err}
	var exit *exec.ExitError
	switch {
	case errors.Is(cctx.Err(), context.DeadlineExceeded):
		ce.TimedOut = true
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		ce.ExitCode = exit.ExitCode()
	case errors.As(err, &exit): // a signal ended it
		ce.Killed = true
		if errors.Is(err, procgroup.ErrCPULimit) {
			ce.CPULimit = lim.CPU
		}
	}
	return run, ce
}

// tailBuffer keeps the last max bytes written to it; it never fails a
// write, so the command never sees a broken pipe.
type tailBuffer struct {
	max int

	mu  sync.Mutex
	buf []byte
	cut bool
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if over := len(w.buf) - w.max; over > 0 {
		w.buf = append(w.buf[:0], w.buf[over:]...)
		w.cut = true
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := string(w.buf)
	if !w.cut {
		return s
	}
	i := 0
	for i < len(s) && !utf8.RuneStart(s[i]) { // the front was dropped: start at a rune
		i++
	}
	return "…" + s[i:]
}

// teeWriter writes to both buffers.
type teeWriter struct{ a, b *tailBuffer }

func (t teeWriter) Write(p []byte) (int, error) {
	_, _ = t.a.Write(p)
	return t.b.Write(p)
}
