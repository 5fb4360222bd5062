package procgroup

import (
	"errors"
	"fmt"
	"time"
)

// Limits bound what each process of a command may use: the command itself
// and every process it starts, each on its own count. They are set as hard
// limits before the command's own code runs, so no process of it can raise
// them (short of CAP_SYS_RESOURCE, which a service running as non-root does
// not have). A zero field leaves that resource as the service has it
// (usually unlimited); a limit above the service's own hard limit is
// lowered to it. The zero value sets none. Linux only: elsewhere commands
// run without them.
type Limits struct {
	// CPU is the CPU time each process may use (RLIMIT_CPU), in whole
	// seconds, rounded up. At it the process gets SIGXCPU, which ends it
	// unless it catches the signal, and SIGKILL one second later; a run so
	// ended fails with ErrCPULimit.
	CPU time.Duration
	// Memory is how many bytes of writable private memory each process may
	// map (RLIMIT_DATA: its heap and anonymous mappings). Past it an
	// allocation fails (ENOMEM), which most programs report and die of.
	// Address space reserved but not writable does not count, so runtimes
	// that reserve much more than they use (Node reserves over 10 GiB for
	// WebAssembly, Go and the JVM reserve their heaps) run under a limit of
	// what they use, which RLIMIT_AS would not allow. Shared memory and
	// files on tmpfs are not counted: the container's memory limit bounds
	// the whole.
	Memory int64
	// Files is how many file descriptors each process may hold open
	// (RLIMIT_NOFILE): past it opening a file, a socket or a pipe fails
	// with EMFILE ("too many open files").
	Files int
}

// DefaultLimits are the limits the dispatch binary gives each process of
// an agent command, a command step and a command verifier unless its
// deployment sets others (DISPATCH_AGENT_CPU, DISPATCH_COMMAND_MEMORY, …):
// 10 minutes of CPU time (what one thread can spend in the default command
// timeout), 4 GiB of memory (an agent CLI on Node, a Go build or test run
// need well under it) and 1,024 open files (the usual soft limit).
var DefaultLimits = Limits{CPU: 10 * time.Minute, Memory: 4 << 30, Files: 1024}

// ErrCPULimit is the error (errors.Is) of a run whose command was killed
// for using up its CPU time (Limits.CPU): a signal the command did not ask
// for, and would get again on the same input.
var ErrCPULimit = errors.New("CPU time limit exceeded")

// Validate reports every negative limit.
func (l Limits) Validate() error {
	var errs []error
	if l.CPU < 0 {
		errs = append(errs, fmt.Errorf("CPU time limit %s is negative", l.CPU))
	}
	if l.Memory < 0 {
		errs = append(errs, fmt.Errorf("memory limit %d is negative", l.Memory))
	}
	if l.Files < 0 {
		errs = append(errs, fmt.Errorf("open files limit %d is negative", l.Files))
	}
	return errors.Join(errs...)
}

// cpuSeconds is CPU rounded up to whole seconds (0: none).
func (l Limits) cpuSeconds() uint64 {
	if l.CPU <= 0 {
		return 0
	}
	return uint64((l.CPU + time.Second - 1) / time.Second)
}

// cpuLimitError is the error of a run its CPU time limit ended.
type cpuLimitError struct{ exit error }

func (e *cpuLimitError) Error() string        { return "killed at its CPU time limit (SIGXCPU)" }
func (e *cpuLimitError) Is(target error) bool { return target == ErrCPULimit }
func (e *cpuLimitError) Unwrap() error        { return e.exit }
