package review

import (
	"context"
	"sync/atomic"
)

// CountListings counts the readings of the queue g does from now on.
func CountListings(g *QueueGauge) *atomic.Int64 {
	var n atomic.Int64
	read := g.readOpen
	g.readOpen = func(ctx context.Context) (map[string]int, error) {
		n.Add(1)
		return read(ctx)
	}
	return &n
}

// SetBulkPage sets the page size of bulk requeues until the test ends.
func SetBulkPage(t interface{ Cleanup(func()) }, n int) {
	old := bulkPage
	bulkPage = n
	t.Cleanup(func() { bulkPage = old })
}
