package verifier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
)

// CommandWaitDelay is how long a check waits, after its command was killed
// or exited, for the command's output pipes to close (a grandchild that left
// the process group may hold them) before giving up on them.
const CommandWaitDelay = procgroup.WaitDelay

// Command runs argv with the task JSON on stdin: exit 0 means the problem
// exists, exit 1 means it is gone; any other exit, a failure to start and a
// timeout are errors. The combined output, trimmed to MaxDetail bytes, is the
// detail. On timeout the whole process group is killed.
type Command struct {
	Argv []string
	// Env names the environment variables the command gets besides
	// procgroup.DefaultEnv; nothing else of the verifier's.
	Env []string
	// Limits bound each process of the command (CPU time, memory, open
	// files). Default: none.
	Limits procgroup.Limits
	// Timeout bounds the run. Default DefaultTimeout.
	Timeout time.Duration
}

// Check runs the command and reads the verdict from its exit code.
func (c *Command) Check(ctx context.Context, t events.Task) (events.Verification, error) {
	v := events.Verification{Verifier: policy.VerifierCommand}
	if len(c.Argv) == 0 {
		return v, errors.New("command verifier: no command")
	}
	data, err := json.Marshal(t)
	if err != nil {
		return v, fmt.Errorf("encode task: %w", err)
	}
	d := timeout(c.Timeout)
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cmd := procgroup.Command(cctx, c.Argv, "", data, c.Env, c.Limits)
	var out headWriter
	cmd.Stdout, cmd.Stderr = &out, &out
	err = procgroup.Run(cmd)
	detail := clip(out.String())
	name := strings.Join(c.Argv, " ")
	if err != nil && cctx.Err() != nil {
		err = checkErr(ctx, cctx, d, cctx.Err())
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		v.Verdict, v.Detail = events.VerdictExists, detail
		return v, nil
	case errors.As(err, &exit) && exit.ExitCode() == 1 && cctx.Err() == nil:
		v.Verdict, v.Detail = events.VerdictStale, detail
		return v, nil
	case detail != "":
		return v, fmt.Errorf("command verifier %q: %w: %s", name, err, detail)
	default:
		return v, fmt.Errorf("command verifier %q: %w", name, err)
	}
}

// headWriter keeps the first MaxDetail+1 bytes written to it and discards the
// rest, always reporting success so the command never sees a broken pipe.
type headWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (w *headWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := MaxDetail + 1 - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (w *headWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}
