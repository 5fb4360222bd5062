package webhook

import (
	"math/rand/v2"
	"net/http"
	"strconv"
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

// RetryAfter is the wait a Retry-After header value asks for, from now:
// delay-seconds or an HTTP date; 0 when it is absent, malformed or past.
func RetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 || n > 1<<31 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
