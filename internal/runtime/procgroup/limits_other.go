//go:build !linux

package procgroup

import "os/exec"

// limit leaves cmd as it is: resource limits are set on Linux only.
func limit(*exec.Cmd, Limits) {}
