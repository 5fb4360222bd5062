package review

import (
	"context"
	"sync/atomic"
)

// CountListings counts the listings g does from now on.
func CountListings(g *QueueGauge) *atomic.Int64 {
	var n atomic.Int64
	list := g.list
	g.list = func(ctx context.Context, f Filter) (Queue, error) {
		n.Add(1)
		return list(ctx, f)
	}
	return &n
}
