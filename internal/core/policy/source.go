package policy

import (
	"context"
	"sync"
	"sync/atomic"
)

// Snapshot is one policy and the revision of the bucket it came from
// (0: none — built-in defaults, or a fixed policy).
type Snapshot struct {
	File *File
	Rev  uint64
}

// For returns the merged policy of a task type.
func (p *Snapshot) For(taskType string) Type {
	if p == nil {
		return (*File)(nil).For(taskType)
	}
	return p.File.For(taskType)
}

// Names reports whether the policy names taskType (File.Names).
func (p *Snapshot) Names(taskType string) bool {
	if p == nil {
		return false
	}
	return p.File.Names(taskType)
}

// Source hands out the policy in force. policykv.Watch serves the one in the KV
// bucket and follows its changes; Static a fixed one. The zero value (and a
// nil *Source) serves built-in defaults.
type Source struct {
	current atomic.Pointer[Snapshot]
	mu      sync.Mutex
	// seen is the newest revision handled, applied or refused; changed is
	// closed when it grows.
	seen    uint64
	changed chan struct{}
}

// Static serves a fixed policy (tests, embedding) under revision 0.
func Static(f *File) *Source {
	s := &Source{}
	s.current.Store(&Snapshot{File: f})
	return s
}

// Snapshot returns the policy in force and its revision, together: a
// service decides with its File and names its Rev on the events it
// publishes.
func (s *Source) Snapshot() *Snapshot {
	if s == nil {
		return &Snapshot{}
	}
	if p := s.current.Load(); p != nil {
		return p
	}
	return &Snapshot{}
}

// For returns the merged policy of a task type.
func (s *Source) For(taskType string) Type { return s.Snapshot().For(taskType) }

// Names reports whether the policy in force names taskType (File.Names).
func (s *Source) Names(taskType string) bool { return s.Snapshot().Names(taskType) }

// File returns the policy in force (nil means built-in defaults).
func (s *Source) File() *File { return s.Snapshot().File }

// Rev is the revision of the policy in force.
func (s *Source) Rev() uint64 { return s.Snapshot().Rev }

// Handled is the newest revision the source has handled.
func (s *Source) Handled() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen
}

// Store puts p in force (nil: keep the one in force) and records that
// revision seen was handled (the KV watcher, policykv.Watch, calls it).
func (s *Source) Store(p *Snapshot, seen uint64) {
	if p != nil {
		s.current.Store(p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if seen > s.seen {
		s.seen = seen
		if s.changed != nil {
			close(s.changed)
			s.changed = nil
		}
	}
}

// Seen waits until the source has handled revision rev of the bucket —
// applied it, or refused it and kept the policy in force — or ctx ends.
func (s *Source) Seen(ctx context.Context, rev uint64) error {
	for {
		s.mu.Lock()
		if s.seen >= rev {
			s.mu.Unlock()
			return nil
		}
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
