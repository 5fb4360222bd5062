package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// errStale is a compare-and-set that lost: the key moved on from the
// revision the write started from.
var errStale = errors.New("stale revision")

// stateStore holds the shared model facts: values by key, each with the
// revision of its last write (0: none). get reads what this instance has
// seen, without I/O; put writes by compare-and-set from rev (0: the key
// must not exist) and returns errStale when it lost; refresh reads the
// key's latest value into what get sees.
type stateStore interface {
	get(key string) ([]byte, uint64)
	put(ctx context.Context, key string, data []byte, rev uint64) (uint64, error)
	refresh(ctx context.Context, key string) error
	close()
}

type stateEntry struct {
	data []byte
	rev  uint64
}

// memStore keeps the facts in this instance's memory.
type memStore struct {
	mu  sync.Mutex
	m   map[string]stateEntry
	seq uint64
}

func (s *memStore) get(key string) ([]byte, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	return e.data, e.rev
}

func (s *memStore) put(_ context.Context, key string, data []byte, rev uint64) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]stateEntry{}
	}
	if s.m[key].rev != rev {
		return 0, errStale
	}
	s.seq++
	s.m[key] = stateEntry{data: data, rev: s.seq}
	return s.seq, nil
}

func (*memStore) refresh(context.Context, string) error { return nil }
func (*memStore) close()                                {}

// kvStore keeps the facts in a KV bucket, followed by a watcher: reads
// are served from what the watcher delivered (a call asks no server), a
// write is a Create or an Update at the revision read.
type kvStore struct {
	kv     jetstream.KeyValue
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	m  map[string]stateEntry
}

// newKVStore follows kv; it returns once the bucket's current values are
// read.
func newKVStore(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger) (*kvStore, error) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("executor: watch bucket %s: %w", kv.Bucket(), err)
	}
	s := &kvStore{kv: kv, log: log, cancel: cancel, done: make(chan struct{}), m: map[string]stateEntry{}}
	ready := make(chan struct{})
	go func() {
		defer close(s.done)
		defer func() { _ = w.Stop() }()
		initial := true
		for e := range w.Updates() {
			if e == nil { // the current values are in
				if initial {
					initial = false
					close(ready)
				}
				continue
			}
			s.apply(e.Key(), e.Value(), e.Revision(), e.Operation() != jetstream.KeyValuePut)
		}
		if initial {
			close(ready)
		}
	}()
	select {
	case <-ready:
		return s, nil
	case <-ctx.Done():
		s.close()
		return nil, ctx.Err()
	}
}

// apply takes a value seen at rev, unless a later one was seen already.
func (s *kvStore) apply(key string, data []byte, rev uint64, deleted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev <= s.m[key].rev {
		return
	}
	if deleted {
		data = nil
	}
	s.m[key] = stateEntry{data: data, rev: rev}
}

func (s *kvStore) get(key string) ([]byte, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	if e.data == nil {
		// deleted (or never written): a Create writes it, whatever its
		// revision was
		return nil, 0
	}
	return e.data, e.rev
}

func (s *kvStore) put(ctx context.Context, key string, data []byte, rev uint64) (uint64, error) {
	var (
		next uint64
		err  error
	)
	if rev == 0 {
		next, err = s.kv.Create(ctx, key, data)
	} else {
		next, err = s.kv.Update(ctx, key, data, rev)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return 0, errStale
	case err != nil:
		return 0, err
	}
	s.apply(key, data, next, false)
	return next, nil
}

func (s *kvStore) refresh(ctx context.Context, key string) error {
	e, err := s.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		s.mu.Lock()
		s.m[key] = stateEntry{rev: s.m[key].rev} // gone: the next write creates it
		s.mu.Unlock()
		return nil
	case err != nil:
		return err
	}
	s.apply(key, e.Value(), e.Revision(), e.Operation() != jetstream.KeyValuePut)
	return nil
}

func (s *kvStore) close() {
	s.cancel()
	<-s.done
}
