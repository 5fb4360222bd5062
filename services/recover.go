package services

import (
	"context"
	"fmt"
	"runtime/debug"
)

// PanicError is a handler's recovered panic: the value and the stack of
// the goroutine that panicked.
type PanicError struct {
	Value any
	Stack []byte
}

// Error holds the stack, so it reaches the log line and, once the
// message's deliveries are exhausted, the dead-letter record's
// Dispatch-Error header (where NATS turns its newlines into spaces).
func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v\n%s", e.Value, e.Stack) }

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Recoverer turns a panic in next into a *PanicError: the message fails
// like any other (retried, then poison) and the process lives on.
func Recoverer(next Handler) Handler {
	return func(ctx context.Context, m *Msg) (outs []Out, err error) {
		defer func() {
			if p := recover(); p != nil {
				outs, err = nil, &PanicError{Value: p, Stack: debug.Stack()}
			}
		}()
		return next(ctx, m)
	}
}
