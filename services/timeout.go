package services

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrHandlerTimeout is the cause of a handler's context cancelled by
// Timeout; the error of a handler that failed past its deadline wraps it.
var ErrHandlerTimeout = errors.New("handler deadline exceeded")

// Timeout gives next a deadline of d per message: its context is
// cancelled at the deadline (context.Cause is ErrHandlerTimeout), and the
// error it then returns wraps ErrHandlerTimeout. That error decides the
// message's fate like any other: a plain error is retried with backoff.
// A handler that ignores its context still runs to the end, and what it
// returns stands. d <= 0 sets no deadline.
func Timeout(d time.Duration) Middleware {
	return func(next Handler) Handler {
		if d <= 0 {
			return next
		}
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			tctx, cancel := context.WithTimeoutCause(ctx, d, ErrHandlerTimeout)
			defer cancel()
			outs, err := next(tctx, m)
			if err != nil && ctx.Err() == nil && errors.Is(context.Cause(tctx), ErrHandlerTimeout) {
				err = fmt.Errorf("%w (%s): %w", ErrHandlerTimeout, d, err)
			}
			return outs, err
		}
	}
}
