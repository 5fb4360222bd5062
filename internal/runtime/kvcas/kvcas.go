// Package kvcas updates JSON values in a JetStream KV bucket with a
// compare-and-set loop, so concurrent writers never lose an update.
package kvcas

import (
	"context"
	"errors"
	"fmt"

	json "github.com/go-json-experiment/json/v1"
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
// aborts. Update returns the value as stored. A conflict is retried at
// once, then with a growing delay; after MaxConflicts in a row Update
// gives up with ErrContended.
func Update[T any](ctx context.Context, kv jetstream.KeyValue, key string, mutate func(v *T, found bool) error) (T, error) {
	v, _, err := UpdateFrom(ctx, kv, key, nil, 0, mutate)
	return v, err
}

// UpdateFrom is Update starting from a value the caller already knows as
// stored at revision rev (known nil: none): the first compare-and-set is
// tried against it without reading the key, and a conflict reads the key
// as Update does. A known value is trusted only as far as its revision: a
// write that followed it makes the compare-and-set fail. It returns the
// value as stored and its revision (0: the key does not exist).
//
// A mutate that changes nothing on the known value reads the key and runs
// again: "no change" is only trusted of the value as stored. known is
// copied before mutate sees it (a shallow copy: mutate must not change
// what the value's slices and maps hold in place).
func UpdateFrom[T any](ctx context.Context, kv jetstream.KeyValue, key string, known *T, rev uint64, mutate func(v *T, found bool) error) (T, uint64, error) {
	if rev == 0 {
		known = nil
	}
	lost := 0 // compare-and-sets lost in a row
	for {
		var (
			v       T
			found   bool
			err     error
			trusted = known == nil // the value as stored, not as known
		)
		if !trusted {
			v, found, known = *known, true, nil
		} else if v, rev, found, err = Get[T](ctx, kv, key); err != nil {
			return v, 0, err
		}
		if err := mutate(&v, found); err != nil {
			if errors.Is(err, ErrNoChange) && !trusted {
				continue // "nothing to do" is only true of the value as stored
			}
			if errors.Is(err, ErrNoChange) {
				return v, rev, nil
			}
			return v, 0, err
		}
		data, err := json.Marshal(v)
		if err != nil {
			return v, 0, fmt.Errorf("kv %s: encode %s: %w", kv.Bucket(), key, err)
		}
		var next uint64
		if found {
			next, err = kv.Update(ctx, key, data, rev)
		} else {
			next, err = kv.Create(ctx, key, data)
		}
		switch {
		case err == nil:
			return v, next, nil
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			// Someone wrote first: read again and reapply — at once the
			// first time, then after a growing delay, at most MaxConflicts
			// times in a row.
			lost++
			if err := conflicted(ctx, kv.Bucket(), key, lost); err != nil {
				return v, 0, err
			}
			continue
		default:
			return v, 0, err
		}
	}
}
