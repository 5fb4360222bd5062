// Package kvcas updates JSON values in a JetStream KV bucket with a
// compare-and-set loop, so concurrent writers never lose an update.
package kvcas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoChange returned by a mutate function leaves the stored value as it is.
var ErrNoChange = errors.New("kvcas: no change")

// Get reads key into a T; found is false when the key does not exist.
func Get[T any](ctx context.Context, kv jetstream.KeyValue, key string) (v T, rev uint64, found bool, err error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return v, 0, false, nil
	}
	if err != nil {
		return v, 0, false, err
	}
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return v, 0, false, fmt.Errorf("kv %s: decode %s: %w", kv.Bucket(), key, err)
	}
	return v, e.Revision(), true, nil
}

// Update applies mutate to the current value of key (the zero T when absent,
// with found false) and writes the result only if nobody wrote in between,
// retrying on conflict. mutate may run several times and must only change the
// value it is given. Returning ErrNoChange skips the write; any other error
// aborts. Update returns the value as stored.
func Update[T any](ctx context.Context, kv jetstream.KeyValue, key string, mutate func(v *T, found bool) error) (T, error) {
	for {
		v, rev, found, err := Get[T](ctx, kv, key)
		if err != nil {
			return v, err
		}
		if err := mutate(&v, found); err != nil {
			if errors.Is(err, ErrNoChange) {
				return v, nil
			}
			return v, err
		}
		data, err := json.Marshal(v)
		if err != nil {
			return v, fmt.Errorf("kv %s: encode %s: %w", kv.Bucket(), key, err)
		}
		if found {
			_, err = kv.Update(ctx, key, data, rev)
		} else {
			_, err = kv.Create(ctx, key, data)
		}
		switch {
		case err == nil:
			return v, nil
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			if ctx.Err() != nil {
				return v, ctx.Err()
			}
			continue // someone wrote first: read again and reapply
		default:
			return v, err
		}
	}
}
