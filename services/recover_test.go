package services_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

func panicky(v any) services.Handler {
	return func(context.Context, *services.Msg) ([]services.Out, error) { panic(v) }
}

func TestRecoverer(t *testing.T) {
	for _, c := range []struct {
		name    string
		h       services.Handler
		wantErr string // prefix of the error; "" = no error
		is      error  // errors.Is target, when the panic value is an error
	}{
		{name: "no panic", h: func(context.Context, *services.Msg) ([]services.Out, error) {
			return []services.Out{{Subject: "x"}}, nil
		}},
		{name: "an error passes through", h: func(context.Context, *services.Msg) ([]services.Out, error) {
			return nil, fs.ErrNotExist
		}, wantErr: fs.ErrNotExist.Error(), is: fs.ErrNotExist},
		{name: "a string", h: panicky("boom"), wantErr: "handler panic: boom\ngoroutine "},
		{name: "an error", h: panicky(fs.ErrClosed), wantErr: "handler panic: " + fs.ErrClosed.Error(), is: fs.ErrClosed},
		{name: "nil", h: panicky(nil), wantErr: "handler panic: panic called with nil argument"},
	} {
		t.Run(c.name, func(t *testing.T) {
			outs, err := services.Recoverer(c.h)(context.Background(), &services.Msg{})
			if c.wantErr == "" {
				if err != nil || len(outs) != 1 {
					t.Fatalf("outs %v, err %v", outs, err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), c.wantErr) || outs != nil {
				t.Fatalf("outs %v, err %v; want an error starting %q", outs, err, c.wantErr)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("%v is not %v", err, c.is)
			}
			var pe *services.PanicError
			if strings.HasPrefix(c.wantErr, "handler panic") {
				if !errors.As(err, &pe) {
					t.Fatalf("%T is no *PanicError", err)
				}
				// The stack names the function that panicked.
				if !strings.Contains(string(pe.Stack), "panicky") || !strings.Contains(err.Error(), "recover_test.go") {
					t.Errorf("stack lost:\n%s", err)
				}
			}
		})
	}
}

// A handler that panics on its last delivery is poison, and the
// dead-letter record's error header holds the panic and its stack.
func TestRouterPanicStackReachesTheDeadLetter(t *testing.T) {
	s := setup(t)
	review := subscribe(t, s.NC, events.ReviewFilter)
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		panic("boom")
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "payload")
	m := review()
	got := m.Header.Get(events.HeaderError)
	if !strings.HasPrefix(got, "failed 3 deliveries, last error: handler panic: boom goroutine ") ||
		!strings.Contains(got, "recover_test.go") || !strings.Contains(got, "runtime/debug.Stack") {
		t.Fatalf("error header %q", got)
	}
}
