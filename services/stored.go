package services

import (
	"context"
	"sync"
)

// OnStored runs fn once the outputs the handler returns for the message
// it is handling are published, if the last of them was stored as a new
// message — not deduplicated by the stream as the republish of one stored
// before under the same Msg-Id. What a handler counts with it is counted
// once per decision, however often its message is delivered: a redelivery
// republishes the same outputs, deduplicated (within the stream's
// deduplication window), and counts nothing; a delivery that was snoozed,
// or failed before its outputs were stored, counted nothing either. fn runs
// nothing when the handler fails, returns no output, or its outputs cannot
// be published.
//
// Outside a Router (a handler called directly, in a test) fn runs at once.
func OnStored(ctx context.Context, fn func()) {
	h, _ := ctx.Value(storedKey{}).(*storedHooks)
	if h == nil {
		fn()
		return
	}
	h.mu.Lock()
	h.fns = append(h.fns, fn)
	h.mu.Unlock()
}

type storedKey struct{}

// storedHooks are the functions OnStored registered while one message was
// handled.
type storedHooks struct {
	mu  sync.Mutex
	fns []func()
}

// withStoredHooks returns ctx carrying a fresh set of hooks for OnStored.
func withStoredHooks(ctx context.Context) (context.Context, *storedHooks) {
	h := &storedHooks{}
	return context.WithValue(ctx, storedKey{}, h), h
}

// run calls every registered function, once.
func (h *storedHooks) run() {
	h.mu.Lock()
	fns := h.fns
	h.fns = nil
	h.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}
