package procgroup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv names what this test binary does when a test runs it as a
// command (os/exec's helper-process pattern): "files" opens files until
// it cannot, "alloc N" maps N MiB of private memory and writes to it.
const helperEnv = "PROCGROUP_TEST_HELPER"

func TestMain(m *testing.M) {
	if what := os.Getenv(helperEnv); what != "" {
		os.Exit(helper(what))
	}
	os.Exit(m.Run())
}

func helper(what string) int {
	switch verb, arg, _ := strings.Cut(what, " "); verb {
	case "files":
		for n := 0; ; n++ {
			f, err := os.Open(os.DevNull)
			if err != nil {
				fmt.Printf("opened %d: %v\n", n, err)
				return 1
			}
			defer f.Close()
		}
	case "parent": // as a service: a user of its own, a secret, a command
		return parentHelper(arg == "hidden")
	case "alloc": // as malloc does for a large block
		mib, _ := strconv.Atoi(arg)
		b, err := syscall.Mmap(-1, 0, mib<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err != nil {
			fmt.Printf("allocate %d MiB: %v\n", mib, err)
			return 1
		}
		for i := 0; i < len(b); i += os.Getpagesize() { // written, so the memory is really used
			b[i] = 1
		}
		fmt.Printf("allocated %d MiB\n", mib)
		return 0
	}
	return 2
}

// run runs argv under lim with the helper's variable passed on, and
// returns its combined output and Run's error.
func run(t *testing.T, lim Limits, argv ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a deadlock guard
	defer cancel()
	cmd := Command(ctx, argv, "", nil, []string{helperEnv}, lim)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := Run(cmd)
	if ctx.Err() != nil {
		t.Fatalf("%q did not end: %s", argv, out.String())
	}
	return out.String(), err
}

// self runs this test binary as the helper what.
func self(t *testing.T, lim Limits, what string) (string, error) {
	t.Helper()
	t.Setenv(helperEnv, what)
	return run(t, lim, os.Args[0])
}

// The command reports the limits it was given, soft and hard: the CPU
// time's hard limit a second past the soft one (SIGKILL after SIGXCPU),
// the others equal. A zero limit leaves the resource as the service has it.
func TestCommandReportsItsLimits(t *testing.T) {
	report := []string{"sh", "-c", "ulimit -St; ulimit -Ht; ulimit -Sd; ulimit -Hd; ulimit -Sn; ulimit -Hn"}
	out, err := run(t, Limits{CPU: 7 * time.Second, Memory: 256 << 20, Files: 100}, report...)
	if want := "7\n8\n262144\n262144\n100\n100\n"; err != nil || out != want {
		t.Errorf("limited: %q, %v; want %q (CPU s, memory KiB, files)", out, err, want)
	}

	unlimited, err := run(t, Limits{}, report...)
	if err != nil {
		t.Fatal(err)
	}
	u := strings.Split(unlimited, "\n")
	out, err = run(t, Limits{Files: 100}, report...)
	if want := strings.Join(append(u[:4:4], "100", "100", ""), "\n"); err != nil || out != want {
		t.Errorf("only files limited: %q, %v; want %q (the others as without limits)", out, err, want)
	}

	// Above the service's own hard limit: lowered to it, not refused.
	var own syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &own); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, Limits{Files: 1 << 30}, "sh", "-c", "ulimit -Hn")
	if want := fmt.Sprintf("%d\n", own.Max); err != nil || out != want {
		t.Errorf("files above the service's hard limit: %q, %v; want %q", out, err, want)
	}
}

// The limits are hard: the command cannot raise them.
func TestCommandCannotRaiseItsLimits(t *testing.T) {
	out, err := run(t, Limits{Files: 100}, "sh", "-c", "ulimit -n 200 && echo raised")
	if err == nil || strings.Contains(out, "raised") {
		t.Errorf("the command raised its open files limit: %q, %v", out, err)
	}
}

func TestCommandOverItsFilesLimitFails(t *testing.T) {
	out, err := self(t, Limits{Files: 20}, "files")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "too many open files") {
		t.Fatalf("%q, %v; want exit 1 after EMFILE", out, err)
	}
	var n int
	if _, err := fmt.Sscanf(out, "opened %d:", &n); err != nil || n == 0 || n >= 20 {
		t.Errorf("opened %d files under a limit of 20 (%q)", n, out)
	}
}

func TestCommandOverItsMemoryLimitFails(t *testing.T) {
	if raceDetector {
		t.Skip("under the race detector the child's ThreadSanitizer cannot start within 256 MiB of RLIMIT_DATA")
	}
	lim := Limits{Memory: 256 << 20} // a Go program's runtime maps about 40 MiB at start
	out, err := self(t, lim, "alloc 512")
	if err == nil || out != "allocate 512 MiB: cannot allocate memory\n" {
		t.Errorf("512 MiB under a 256 MiB limit: %q, %v; want the allocation to fail", out, err)
	}
	if out, err := self(t, lim, "alloc 32"); err != nil || out != "allocated 32 MiB\n" {
		t.Errorf("32 MiB under a 256 MiB limit: %q, %v; want it allocated", out, err)
	}
}

// A command spinning past its CPU time limit is killed, and the run says so.
func TestCommandOverItsCPULimitIsKilled(t *testing.T) {
	out, err := run(t, Limits{CPU: time.Second}, "sh", "-c", "while :; do :; done")
	var exit *exec.ExitError
	if !errors.Is(err, ErrCPULimit) || !errors.As(err, &exit) || !strings.Contains(err.Error(), "CPU time limit") {
		t.Fatalf("%q, %v; want ErrCPULimit wrapping the exit", out, err)
	}
}

// A limited command that cannot be run exits as from a shell: 127 when it
// does not exist, naming it.
func TestLimitedCommandNotFound(t *testing.T) {
	out, err := run(t, Limits{Files: 100}, "/nonexistent/validator")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitNotFound || !strings.Contains(out, "/nonexistent/validator") {
		t.Errorf("%q, %v; want exit 127 naming the command", out, err)
	}
	// A bare name is looked up before anything starts, as without limits.
	if _, err := run(t, Limits{Files: 100}, "no-such-command-here"); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("bare name: %v, want exec.ErrNotFound", err)
	}
}
