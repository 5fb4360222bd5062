package services

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrHeartbeatLost is the cause of a handler's context cancelled by
// Heartbeat because no beat reached the server for nearly a whole ack
// window; the error of a handler that failed after it wraps it.
var ErrHeartbeatLost = errors.New("heartbeat lost: the message's ack window is running out")

// heartbeatWindows is how many intervals the ack window lasts: the router
// beats every AckWait/3.
const heartbeatWindows = 3

// Heartbeat calls m.InProgress every interval while next runs, so the
// server does not hand a message whose handler outlives AckWait (a long
// model call) to another worker. The router uses AckWait/3: the ack
// window is taken to be 3 intervals. A message without InProgress, or an
// interval <= 0, gets no heartbeat.
//
// A beat that fails (the connection is down, its buffer full) is tried
// again every quarter interval until one gets through. If none does before
// the window would lapse — when the server hands the message to another
// worker, which runs the same pass (and pays the model again) — next's
// context is cancelled a quarter interval before it does, with cause
// ErrHeartbeatLost: this worker stops instead of running the pass beside
// the other. The error next then returns wraps ErrHeartbeatLost and
// decides the message's fate like any other; a handler that ignores its
// context runs to the end, and what it returns stands.
//
// A waiting heartbeat is a runtime timer, not a goroutine: a thousand model
// calls in flight cost a thousand timers. No beat is sent once next has
// returned (the message may be acked by then).
func Heartbeat(every time.Duration) Middleware {
	return func(next Handler) Handler {
		if every <= 0 {
			return next
		}
		retry := max(every/4, time.Millisecond)
		window := heartbeatWindows * every
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			if m.InProgress == nil {
				return next(ctx, m)
			}
			hctx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			var (
				mu      sync.Mutex
				stopped bool
				t       *time.Timer
				// through is when the server last heard of the message:
				// its delivery, then each beat that got through.
				through = time.Now()
			)
			mu.Lock()
			t = time.AfterFunc(every, func() {
				mu.Lock()
				defer mu.Unlock()
				if stopped {
					return
				}
				now := time.Now()
				if err := m.InProgress(); err == nil {
					through = now
					t.Reset(every)
					return
				}
				if now.Add(retry).Sub(through) >= window {
					// The next try would come too late: another worker
					// may get the message at any moment.
					cancel(ErrHeartbeatLost)
					return
				}
				t.Reset(retry)
			})
			mu.Unlock()
			defer func() {
				mu.Lock()
				stopped = true
				t.Stop()
				mu.Unlock()
			}()
			outs, err := next(hctx, m)
			if err != nil && ctx.Err() == nil && errors.Is(context.Cause(hctx), ErrHeartbeatLost) && !errors.Is(err, ErrHeartbeatLost) {
				err = fmt.Errorf("%w: %w", ErrHeartbeatLost, err)
			}
			return outs, err
		}
	}
}
