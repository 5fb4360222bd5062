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
//
// A waiting heartbeat is a runtime timer, not a goroutine: a thousand model
// calls in flight cost a thousand timers. No beat is sent once next has
// returned (the message may be acked by then).
func Heartbeat(every time.Duration) Middleware {
	return func(next Handler) Handler {
		if every <= 0 {
			return next
		}
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			if m.InProgress == nil {
				return next(ctx, m)
			}
			var (
				mu      sync.Mutex
				stopped bool
				t       *time.Timer
			)
			mu.Lock()
			t = time.AfterFunc(every, func() {
				mu.Lock()
				defer mu.Unlock()
				if stopped {
					return
				}
				// A failed heartbeat is not the handler's failure: at worst
				// the message is redelivered, and handlers are idempotent.
				_ = m.InProgress()
				t.Reset(every)
			})
			mu.Unlock()
			defer func() {
				mu.Lock()
				stopped = true
				t.Stop()
				mu.Unlock()
			}()
			return next(ctx, m)
		}
	}
}
