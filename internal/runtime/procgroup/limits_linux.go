package procgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// Go's os/exec cannot set a child's resource limits between its fork and
// its exec, and setting them on the child after Start (prlimit) would let
// it run unbounded for a moment. So a limited command starts as this very
// binary again (/proc/self/exe, whatever binary that is: dispatch, a test)
// under the name shimName: init below sees the name, sets the limits on
// its own process, which keeps them across exec, and execs the command in
// its place — same pid, process group, descriptors and environment. No
// shell is needed (the runtime image has none) and no file of ours besides
// the running binary.

// shimName is the argv[0] that makes a binary the shim:
// shimName cpu-seconds memory-bytes files path argv...
const shimName = "dispatch-limits"

// selfExe is the running binary, even when its file was replaced since.
const selfExe = "/proc/self/exe"

func init() {
	if len(os.Args) >= 6 && os.Args[0] == shimName {
		os.Exit(shim(os.Args[1:]))
	}
}

// limit makes cmd (from exec.Command, not started) run under lim. A
// command exec.Command could not find keeps its error (cmd.Err).
func limit(cmd *exec.Cmd, lim Limits) {
	if lim == (Limits{}) || cmd.Err != nil {
		return
	}
	cmd.Args = append([]string{shimName,
		strconv.FormatUint(lim.cpuSeconds(), 10), strconv.FormatInt(lim.Memory, 10), strconv.Itoa(lim.Files),
		cmd.Path}, cmd.Args...)
	cmd.Path = selfExe
}

// Exit statuses of a shim that could not run the command, as a shell's:
// found but not run, and not found.
const (
	exitCannotRun = 126
	exitNotFound  = 127
)

// shim sets the limits args name and execs the command; it returns only
// on failure, with the exit status to end with, having said why on stderr.
func shim(args []string) int {
	cpu, err1 := strconv.ParseUint(args[0], 10, 64)
	memory, err2 := strconv.ParseUint(args[1], 10, 64)
	files, err3 := strconv.ParseUint(args[2], 10, 64)
	path, argv := args[3], args[4:]
	if err := errors.Join(err1, err2, err3); err != nil {
		fmt.Fprintf(os.Stderr, "dispatch: %s: bad limits: %v\n", path, err)
		return exitCannotRun
	}
	for _, l := range []struct {
		name        string
		resource    int
		value, over uint64
	}{
		// SIGXCPU at the limit, SIGKILL a second later if it was caught.
		{"CPU time", syscall.RLIMIT_CPU, cpu, 1},
		{"memory", syscall.RLIMIT_DATA, memory, 0},
		{"open files", syscall.RLIMIT_NOFILE, files, 0},
	} {
		if l.value == 0 {
			continue // unlimited: as the service has it
		}
		if err := setLimit(l.resource, l.value, l.value+l.over); err != nil {
			fmt.Fprintf(os.Stderr, "dispatch: %s: set the %s limit to %d: %v\n", path, l.name, l.value, err)
			return exitCannotRun
		}
	}
	err := syscall.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "dispatch: %s: %v\n", path, err)
	if errors.Is(err, fs.ErrNotExist) {
		return exitNotFound
	}
	return exitCannotRun
}

// setLimit sets resource's soft limit to soft and its hard limit to hard,
// both at most the hard limit the process has: raising that takes a
// privilege, and the process never had more.
func setLimit(resource int, soft, hard uint64) error {
	var cur syscall.Rlimit
	if err := syscall.Getrlimit(resource, &cur); err != nil {
		return err
	}
	hard = min(hard, cur.Max)
	return syscall.Setrlimit(resource, &syscall.Rlimit{Cur: min(soft, hard), Max: hard})
}
