//go:build linux

package procgroup

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A command that exits 0 but leaves a child running (holding its output)
// succeeded, and the child does not outlive the run.
func TestRunEndsLeftoverChildren(t *testing.T) {
	cmd := Command(context.Background(), []string{"sh", "-c", "sleep 30 & echo $!; exit 0"}, "", nil, nil, Limits{})
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := Run(cmd); err != nil {
		t.Fatalf("Run: %v, want the command's own success", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("child pid %q: %v", out.String(), err)
	}
	deadline := time.Now().Add(time.Minute) // a deadlock guard, not a timing assertion
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still running after the run", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie waiting to be reaped does not).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z")
}
