package kvcas

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrContended is returned by an update whose compare-and-set lost to
// other writers MaxConflicts times in a row: the key is too hot for it
// now. The caller's retry policy takes over (a handler's message is
// nak'ed with its backoff) instead of a loop that never ends.
var ErrContended = errors.New("kvcas: the key changed under every compare-and-set")

// MaxConflicts is how many compare-and-sets in a row one update may lose
// before it gives up with ErrContended. The first conflict is retried at
// once (one other writer got there first: reading again is all it takes);
// each later one waits a delay drawn with full jitter under a ceiling that
// doubles from 2 ms up to 250 ms, so contending writers spread out.
const MaxConflicts = 32

const (
	baseConflictDelay = 2 * time.Millisecond
	maxConflictDelay  = 250 * time.Millisecond
)

var (
	conflicts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dispatch_kv_conflicts_total",
		Help: "Compare-and-sets of a KV update that lost to another writer (retried), by bucket.",
	}, []string{"bucket"})
	contended = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dispatch_kv_contended_total",
		Help: "KV updates given up after MaxConflicts lost compare-and-sets in a row (ErrContended), by bucket.",
	}, []string{"bucket"})
)

// Collectors are the package's metrics (every update of the process
// counts in them), for a process's registry.
func Collectors() []prometheus.Collector { return []prometheus.Collector{conflicts, contended} }

// conflictCeiling is the largest delay after the n-th consecutive
// conflict (1-based): none after the first, then baseConflictDelay
// doubling up to maxConflictDelay.
func conflictCeiling(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	if n-2 >= 20 {
		return maxConflictDelay
	}
	return min(baseConflictDelay<<(n-2), maxConflictDelay)
}

// conflictDelay is the delay after the n-th consecutive conflict, for a
// uniform draw r in [0,1): full jitter under conflictCeiling(n).
func conflictDelay(n int, r float64) time.Duration {
	return time.Duration(r * float64(conflictCeiling(n)))
}

// wait sleeps d or until ctx ends (a variable: tests record the delays).
var wait = func(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// conflicted counts the n-th consecutive lost compare-and-set of key in
// bucket and waits before the next try, or gives up: ErrContended after
// MaxConflicts, ctx's error when it ends.
func conflicted(ctx context.Context, bucket, key string, n int) error {
	conflicts.WithLabelValues(bucket).Inc()
	if n >= MaxConflicts {
		contended.WithLabelValues(bucket).Inc()
		return fmt.Errorf("%w: %s %s lost %d in a row", ErrContended, bucket, key, n)
	}
	if n == 1 {
		return ctx.Err()
	}
	return wait(ctx, conflictDelay(n, rand.Float64()))
}
