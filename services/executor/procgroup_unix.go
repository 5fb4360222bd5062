//go:build unix

package executor

import (
	"os/exec"
	"syscall"
)

// killGroupOnCancel starts cmd in its own process group and makes the
// context's end kill the whole group, so an agent's children die with it.
func killGroupOnCancel(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
