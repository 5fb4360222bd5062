package webhook

import (
	"math/rand/v2"
	"time"
)

// Backoff is the delay before the next try after the n-th failed one:
// base doubling per try, capped at max, with equal jitter — a random
// delay in [d/2, d] — so receivers that fail together are not retried in
// step. rnd returns a float in [0, 1) (nil: math/rand/v2).
func Backoff(base, max time.Duration, rnd func() float64) func(n int) time.Duration {
	if rnd == nil {
		rnd = rand.Float64
	}
	return func(n int) time.Duration {
		d := base
		for i := 1; i < n && d < max; i++ {
			d *= 2
		}
		d = min(d, max)
		return d/2 + time.Duration(rnd()*float64(d/2))
	}
}
