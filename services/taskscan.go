package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
)

// Scan calls fn with the current state of every task, in no particular
// order, and returns once all have been seen (a watch of every key, with a
// consumer on js, that stops at the end of the initial values; only what
// its own consumer delivered is taken, read back from the bucket:
// follow.WatchAll). An error of fn stops it.
func (s *TaskStore) Scan(ctx context.Context, js jetstream.JetStream, fn func(events.TaskState) error) error {
	w, err := follow.WatchAll(ctx, js, s.kv, follow.WatchOptions{IgnoreDeletes: true})
	if err != nil {
		return fmt.Errorf("task store: watch: %w", err)
	}
	return scan(ctx, w, fn)
}

// scan calls fn with each value w delivers until its nil entry.
func scan(ctx context.Context, w jetstream.KeyWatcher, fn func(events.TaskState) error) error {
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("task store: watch stopped before the initial values")
			}
			if e == nil { // every current value has been delivered
				return nil
			}
			var st events.TaskState
			if err := json.Unmarshal(e.Value(), &st); err != nil {
				return fmt.Errorf("task store: decode %s: %w", e.Key(), err)
			}
			if err := fn(st); err != nil {
				return err
			}
		}
	}
}
