package procgroup

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

const secret = "PROCGROUP_TEST_SECRET"

// parentHelper is a service process as deployed: not root (nobody, when
// the test runs as root), a secret in its environment, HideEnviron called
// when hidden. It runs a command that reads its parent's environment and
// says what the command read.
func parentHelper(hidden bool) int {
	if os.Getuid() == 0 {
		if err := syscall.Setgid(65534); err != nil {
			fmt.Println("setgid:", err)
			return 2
		}
		if err := syscall.Setuid(65534); err != nil {
			fmt.Println("setuid:", err)
			return 2
		}
	}
	if hidden {
		if err := HideEnviron(); err != nil || !Hidden() {
			fmt.Println("hide:", err)
			return 2
		}
	} else if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 1, 0); errno != 0 {
		// A change of user makes a process undumpable: one started as
		// that user is not.
		fmt.Println("dumpable:", errno)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := Command(ctx, []string{"sh", "-c", `cat /proc/$PPID/environ | tr '\0' '\n'`}, "/", nil, nil, Limits{Files: 256})
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = Run(cmd)
	fmt.Print(out.String())
	return 0
}

// A command runs as the service's user, with none of its secrets in its
// own environment; with HideEnviron it cannot read its parent's either.
// Without it, it can: the test shows what HideEnviron closes.
func TestCommandCannotReadItsParentsEnvironment(t *testing.T) {
	for _, hidden := range []bool{false, true} {
		t.Run(fmt.Sprintf("hidden=%v", hidden), func(t *testing.T) {
			t.Setenv(secret, "s3cr3t")
			what := "parent"
			if hidden {
				what += " hidden"
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := Command(ctx, []string{os.Args[0]}, "/", nil, []string{helperEnv, secret}, Limits{})
			cmd.Env = append(cmd.Env, helperEnv+"="+what)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := Run(cmd); err != nil {
				t.Fatalf("%v: %s", err, out.String())
			}
			read := strings.Contains(out.String(), secret+"=s3cr3t")
			if hidden && (read || !strings.Contains(out.String(), "Permission denied")) {
				t.Fatalf("the command read its parent's environment, or did not run:\n%s", out.String())
			}
			if !hidden && !read {
				t.Fatalf("without HideEnviron the command should read it (the test shows nothing otherwise):\n%s", out.String())
			}
		})
	}
}
