//go:build !unix

package executor

import "os/exec"

// killGroupOnCancel keeps exec's default on systems without process groups:
// the context's end kills the command itself.
func killGroupOnCancel(*exec.Cmd) {}
