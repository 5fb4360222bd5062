package procgroup

import "syscall"

// HideEnviron keeps this process's memory and environment from the
// commands it runs. Command gives a child none of the service's secrets,
// but a child running as the same user could read them from its parent:
// /proc/<ppid>/environ, /proc/<ppid>/mem, ptrace. A process that is not
// dumpable (prctl PR_SET_DUMPABLE 0) has its /proc files owned by root
// and refuses ptrace to anyone without CAP_SYS_PTRACE, so only root can.
// It also writes no core dump. The commands themselves are dumpable again
// after their exec. Every service process calls it first.
func HideEnviron() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// Hidden reports whether HideEnviron is in force.
func Hidden() bool {
	r, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_GET_DUMPABLE, 0, 0)
	return errno == 0 && r == 0
}
