package executor

import (
	"math"
	"time"
)

// Backoff spaces the redeliveries of a request that failed transiently and
// gave no Retry-After: exponential with full jitter. The zero value is the
// default (1s, ×2, capped at 5m).
type Backoff struct {
	// Base is the ceiling of the first delay. Default 1s.
	Base time.Duration
	// Factor multiplies the ceiling after each transient failure. Default 2.
	Factor float64
	// Max caps the ceiling. Default 5m.
	Max time.Duration
}

// Delay is the delay after the n-th transient failure of a task (1-based),
// given a uniform draw r in [0,1): r × min(Max, Base × Factor^(n-1)).
func (b Backoff) Delay(n int, r float64) time.Duration {
	return time.Duration(r * float64(b.Ceiling(n)))
}

// HalfJitter is the delay after the n-th failure when the count of delays
// matters more than spreading them: half the ceiling plus r × the other
// half. Never below half the ceiling, a wait of a given length takes a
// bounded number of them, whatever the draws.
func (b Backoff) HalfJitter(n int, r float64) time.Duration {
	c := b.Ceiling(n)
	return c/2 + time.Duration(r*float64(c-c/2))
}

// Ceiling is the largest delay after the n-th transient failure.
func (b Backoff) Ceiling(n int) time.Duration {
	base, factor, ceil := b.Base, b.Factor, b.Max
	if base <= 0 {
		base = time.Second
	}
	if factor < 1 {
		factor = 2
	}
	if ceil <= 0 {
		ceil = 5 * time.Minute
	}
	d := float64(base) * math.Pow(factor, float64(max(n, 1)-1))
	if d >= float64(ceil) || math.IsInf(d, 0) || math.IsNaN(d) {
		return ceil
	}
	return time.Duration(d)
}
