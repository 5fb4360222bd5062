package services

import (
	"context"
	"time"
)

// Latency observes how long next takes per message, whatever it returns,
// in dispatch_handler_seconds. The router puts it around the handler
// alone: publishing and settling are not the handler's time. A nil
// metrics records nothing.
func Latency(metrics *Metrics, service string) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			start := time.Now()
			defer func() { metrics.observe(service, time.Since(start).Seconds()) }()
			return next(ctx, m)
		}
	}
}
