package policy

import (
	"log/slog"
	"os"
	"sync/atomic"
	"time"
)

// Source hands out the current policy file and reloads it when the file
// changes on disk. The zero value (and a nil *Source) serves built-in defaults.
type Source struct {
	path    string
	current atomic.Pointer[File]
	modTime time.Time
	log     *slog.Logger
}

// Static serves a fixed policy (tests, embedding).
func Static(f *File) *Source {
	s := &Source{}
	s.current.Store(f)
	return s
}

// Open loads path ("" means built-in defaults).
func Open(path string, log *slog.Logger) (*Source, error) {
	s := &Source{path: path, log: log}
	if path == "" {
		return s, nil
	}
	f, err := Load(path)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(path); err == nil {
		s.modTime = st.ModTime()
	}
	s.current.Store(f)
	return s, nil
}

// For returns the merged policy of a task type.
func (s *Source) For(taskType string) Type {
	if s == nil {
		return (*File)(nil).For(taskType)
	}
	return s.current.Load().For(taskType)
}

// File returns the current policy file (nil means defaults).
func (s *Source) File() *File {
	if s == nil {
		return nil
	}
	return s.current.Load()
}

// Watch reloads the file every interval until done is closed. A file that no
// longer parses is reported and the previous policy stays in force.
func (s *Source) Watch(done <-chan struct{}, interval time.Duration) {
	if s == nil || s.path == "" {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		st, err := os.Stat(s.path)
		if err != nil || !st.ModTime().After(s.modTime) {
			continue
		}
		s.modTime = st.ModTime()
		f, err := Load(s.path)
		if err != nil {
			s.log.Error("policy reload failed; keeping the previous policy", "err", err)
			continue
		}
		s.current.Store(f)
		s.log.Info("policy reloaded", "file", s.path)
	}
}
