package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Each calls fn with the current state of every task, in no particular
// order, and returns once all have been seen (a watch of every key that
// stops at the end of the initial values). An error of fn stops it.
func (s *TaskStore) Each(ctx context.Context, fn func(events.TaskState) error) error {
	w, err := s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("task store: watch: %w", err)
	}
	defer w.Stop()
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
