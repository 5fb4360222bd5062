//go:build !unix

// Package procgroup runs a command in its own process group, so ending it
// (timeout or cancel) also ends the children it started.
package procgroup

import "os/exec"

// KillOnCancel keeps exec's default on systems without process groups: the
// context's end kills the command itself.
func KillOnCancel(*exec.Cmd) {}

// KillGroup does nothing where commands get no process group of their own.
func KillGroup(*exec.Cmd) {}
