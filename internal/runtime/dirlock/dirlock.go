// Package dirlock keeps a directory to one process at a time: the one
// holding an exclusive lock on a file in it. The kernel drops the lock when
// the process exits, however it exits, so a crash leaves nothing stale.
package dirlock

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FileName is the lock file in a locked directory. It stays after
// Release: it holds the last holder's pid, not the lock.
const FileName = "dispatch.lock"

// HeldError says another process holds the directory.
type HeldError struct {
	Dir string
	// PID of the holder as it recorded it; 0 when unknown.
	PID int
}

func (e *HeldError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who += fmt.Sprintf(" (pid %d)", e.PID)
	}
	return fmt.Sprintf("%s is in use by %s, which holds %s", e.Dir, who, filepath.Join(e.Dir, FileName))
}

// Lock is a held directory.
type Lock struct{ f *os.File }

// Acquire locks dir (created if missing) without waiting and records this
// process's pid in it; *HeldError when another process holds it.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, FileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if held {
		b, _ := os.ReadFile(path)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		f.Close()
		return nil, &HeldError{Dir: dir, PID: pid}
	}
	// The pid only improves the next one's error: not writing it is no
	// reason to refuse the lock.
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Lock{f: f}, nil
}

// Release lets the next process in.
func (l *Lock) Release() error { return l.f.Close() }
