package natstest

import (
	"context"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// CountReads is a bucket that counts its reads (Get), for a test that a
// write path reads nothing it need not.
type CountReads struct {
	jetstream.KeyValue
	gets atomic.Int64
}

// Get reads key, counted.
func (c *CountReads) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	c.gets.Add(1)
	return c.KeyValue.Get(ctx, key)
}

// Reads is how many reads were made since the last Reset.
func (c *CountReads) Reads() int { return int(c.gets.Load()) }

// Reset sets the count to zero.
func (c *CountReads) Reset() { c.gets.Store(0) }
