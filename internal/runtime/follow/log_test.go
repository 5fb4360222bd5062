package follow_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

var discard = slog.New(slog.DiscardHandler)

// logBuffer collects what a follower logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) has(s string) bool { return strings.Contains(b.String(), s) }

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
