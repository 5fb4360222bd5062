//go:build !linux

package procgroup

// HideEnviron does nothing beyond Linux: there, a command running as the
// service's user can read the service's environment.
func HideEnviron() error { return nil }

// Hidden reports false beyond Linux.
func Hidden() bool { return false }
