//go:build unix

// Package procgroup runs a command in its own process group, so ending it
// (timeout or cancel) also ends the children it started.
package procgroup

import (
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
