package kvcas

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	json "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go/jetstream"
)

// Writer is Update for keys that many goroutines of one process write at
// once — a task type's trust stats, a subject's history — so that a hot key
// costs neither conflicts nor a round trip per update:
//
//   - Updates of one key are applied one batch at a time. Those that arrive
//     while a batch is being written wait and go together, in arrival order,
//     into the next compare-and-set: the process is the key's only writer
//     from its own side, and a burst of n updates costs one write, not n
//     reads, n writes and the conflicts between them.
//   - It remembers the value and revision it last wrote for each key (a
//     bounded number of keys), so the next batch needs no read. A write
//     that finds the key changed by someone else (another instance, the
//     gate) reads it and reapplies the batch, exactly like Update (with its
//     backoff, and ErrContended after MaxConflicts in a row). With
//     Clone set it remembers the value itself, not its encoding, so a batch
//     costs no decode either.
//
// Decisions taken on a remembered value are only final once written: a
// batch that changes nothing is checked against a fresh read before its
// callers are answered, so a value remembered from before another writer's
// update never stands in for the stored one.
//
// A mutate function that returns an error other than ErrNoChange must leave
// v as it found it (the other updates of its batch are still applied). It
// may be called more than once (on conflict), with a fresh value each time.
type Writer[T any] struct {
	kv jetstream.KeyValue
	// Remember bounds the keys whose last written value is kept. Default 4096.
	Remember int
	// Timeout bounds one batch's reads and writes. Default 30s.
	Timeout time.Duration
	// Clone, when set, returns a copy of a value that shares nothing a
	// mutate function may change (slices, maps, pointers). The Writer then
	// remembers a copy of the last value it wrote to a key, and the next
	// batch starts from a copy of that instead of decoding JSON: neither
	// mutate functions nor callers ever hold the remembered value.
	Clone func(T) T

	mu      sync.Mutex
	pending map[string]*[]*op[T] // keys with a batch being written, and what waits for the next
	last    map[string]written[T]
}

// written is a key's last written value: its JSON, or with Clone set a
// copy of the value itself.
type written[T any] struct {
	data []byte
	v    T
	rev  uint64
}

type op[T any] struct {
	mutate func(v *T, found bool) error
	done   chan struct{}
	v      T
	err    error
}

// NewWriter returns a Writer on kv.
func NewWriter[T any](kv jetstream.KeyValue) *Writer[T] {
	return &Writer[T]{kv: kv, pending: map[string]*[]*op[T]{}, last: map[string]written[T]{}}
}

// Update applies mutate to the value of key (see the package's Update) and
// returns the value once its batch is stored. If ctx ends first Update
// returns ctx.Err(); the update may still be applied (updates must be
// idempotent, as every redelivered handler's are).
func (w *Writer[T]) Update(ctx context.Context, key string, mutate func(v *T, found bool) error) (T, error) {
	o := &op[T]{mutate: mutate, done: make(chan struct{})}
	w.mu.Lock()
	queue, busy := w.pending[key]
	if !busy {
		queue = new([]*op[T])
		w.pending[key] = queue
	}
	*queue = append(*queue, o)
	w.mu.Unlock()
	if !busy {
		go w.drain(context.WithoutCancel(ctx), key, queue)
	}
	select {
	case <-o.done:
		return o.v, o.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// drain writes the batches of key until nobody waits.
func (w *Writer[T]) drain(ctx context.Context, key string, queue *[]*op[T]) {
	timeout := w.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	for {
		w.mu.Lock()
		batch := *queue
		*queue = nil
		if len(batch) == 0 {
			delete(w.pending, key)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		bctx, cancel := context.WithTimeout(ctx, timeout)
		w.write(bctx, key, batch)
		cancel()
		for _, o := range batch {
			close(o.done)
		}
	}
}

// write applies batch to key's value under compare-and-set and sets each
// op's result.
func (w *Writer[T]) write(ctx context.Context, key string, batch []*op[T]) {
	fail := func(err error) {
		w.forget(key)
		for _, o := range batch {
			o.err = err
		}
	}
	remembered, fromMemory := w.remembered(key)
	lost := 0 // compare-and-sets lost in a row
	for {
		var (
			v     T
			rev   uint64
			found bool
			err   error
		)
		if fromMemory && w.Clone != nil {
			// A copy: whatever the batch's mutate functions do to it, the
			// remembered value stays as written.
			v, rev, found = w.Clone(remembered.v), remembered.rev, true
		} else if fromMemory {
			if err := json.Unmarshal(remembered.data, &v); err != nil {
				fromMemory = false
				w.forget(key)
				continue
			}
			rev, found = remembered.rev, true
		} else if v, rev, found, err = Get[T](ctx, w.kv, key); err != nil {
			fail(err)
			return
		}

		changed, exists := false, found
		for _, o := range batch {
			o.err = o.mutate(&v, exists)
			switch {
			case o.err == nil:
				changed, exists = true, true
			case errors.Is(o.err, ErrNoChange):
				o.err = nil
			}
		}
		if !changed {
			if fromMemory { // nothing to write: decide on the stored value
				fromMemory = false
				continue
			}
			w.setAll(batch, v)
			return
		}

		data, err := json.Marshal(v)
		if err != nil {
			fail(fmt.Errorf("kv %s: encode %s: %w", w.kv.Bucket(), key, err))
			return
		}
		var newRev uint64
		if found {
			newRev, err = w.kv.Update(ctx, key, data, rev)
		} else {
			newRev, err = w.kv.Create(ctx, key, data)
		}
		switch {
		case err == nil:
			if w.Clone != nil {
				w.remember(key, written[T]{v: w.Clone(v), rev: newRev})
			} else {
				w.remember(key, written[T]{data: data, rev: newRev})
			}
			w.setAll(batch, v)
			return
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			// Someone else wrote: read it and reapply (see conflicted).
			lost++
			if err := conflicted(ctx, w.kv.Bucket(), key, lost); err != nil {
				fail(err)
				return
			}
			fromMemory = false
			w.forget(key)
		default:
			fail(err)
			return
		}
	}
}

func (w *Writer[T]) setAll(batch []*op[T], v T) {
	for _, o := range batch {
		o.v = v
	}
}

func (w *Writer[T]) remembered(key string) (written[T], bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.last[key]
	return e, ok
}

func (w *Writer[T]) remember(key string, e written[T]) {
	limit := w.Remember
	if limit <= 0 {
		limit = 4096
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.last[key]; !ok && len(w.last) >= limit {
		for k := range w.last { // evict one: any will do
			delete(w.last, k)
			break
		}
	}
	w.last[key] = e
}

func (w *Writer[T]) forget(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, key)
}
