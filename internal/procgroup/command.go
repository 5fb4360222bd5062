package procgroup

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"time"
)

// WaitDelay is how long a run waits, after its command was killed or
// exited, for the output pipes to close (a grandchild that left the process
// group may hold them) before giving up on them.
const WaitDelay = time.Second

// Command prepares argv (non-empty) to run in dir with stdin as its input,
// in its own process group, killed with its children when ctx ends. The
// caller sets Stdout and Stderr.
func Command(ctx context.Context, argv []string, dir string, stdin []byte) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
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
// lost).
func Run(cmd *exec.Cmd) error {
	err := cmd.Run()
	if !errors.Is(err, exec.ErrWaitDelay) {
		return err
	}
	KillGroup(cmd)
	if cmd.ProcessState != nil && cmd.ProcessState.Success() {
		return nil
	}
	return err
}
