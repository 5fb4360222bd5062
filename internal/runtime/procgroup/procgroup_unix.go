//go:build unix

// Package procgroup runs a command in its own process group, so ending it
// (timeout or cancel) also ends the children it started, with no more of
// the service's environment than it needs (Environ) and under resource
// limits (Limits).
package procgroup

import (
	"errors"
	"os/exec"
	"syscall"
)

// KillOnCancel starts cmd in its own process group and makes the context's
// end kill the whole group, so a shell's or an agent's children die with it.
func KillOnCancel(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// KillGroup kills the process group cmd ran in (what is left of it).
func KillGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// cpuLimited is err, or a *cpuLimitError wrapping it when the command was
// killed by SIGXCPU, the signal of a CPU time limit.
func cpuLimited(err error) error {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGXCPU {
			return &cpuLimitError{exit: err}
		}
	}
	return err
}
