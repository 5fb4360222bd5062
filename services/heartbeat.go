package services

import (
	"context"
	"sync"
	"time"
)

// Heartbeat calls m.InProgress every interval while next runs, so the
// server does not hand a message whose handler outlives AckWait (a long
// model call) to another worker. The router uses AckWait/3. A message
// without InProgress, or an interval <= 0, gets no heartbeat.
func Heartbeat(every time.Duration) Middleware {
	return func(next Handler) Handler {
		if every <= 0 {
			return next
		}
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			if m.InProgress == nil {
				return next(ctx, m)
			}
			done := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				t := time.NewTicker(every)
				defer t.Stop()
				for {
					select {
					case <-done:
						return
					case <-t.C:
						// A failed heartbeat is not the handler's failure: at
						// worst the message is redelivered, and handlers are
						// idempotent.
						_ = m.InProgress()
					}
				}
			})
			defer wg.Wait()
			defer close(done)
			return next(ctx, m)
		}
	}
}
