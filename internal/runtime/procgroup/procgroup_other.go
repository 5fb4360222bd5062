//go:build !unix

// Package procgroup runs a command in its own process group, so ending it
// (timeout or cancel) also ends the children it started, with no more of
// the service's environment than it needs (Environ) and under resource
// limits (Limits).
package procgroup

import "os/exec"

// KillOnCancel keeps exec's default on systems without process groups: the
// context's end kills the command itself.
func KillOnCancel(*exec.Cmd) {}

// KillGroup does nothing where commands get no process group of their own.
func KillGroup(*exec.Cmd) {}

// cpuLimited is err: there is no CPU time limit here.
func cpuLimited(err error) error { return err }
