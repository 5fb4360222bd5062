//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package dirlock

import (
	"errors"
	"os"
	"syscall"
)

// tryLock takes an exclusive flock on f; held reports another holder.
func tryLock(f *os.File) (held bool, err error) {
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}
