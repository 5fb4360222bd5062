package services_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

func TestTimeout(t *testing.T) {
	waits := func(ret error) services.Handler { // a handler that honours its context
		return func(ctx context.Context, _ *services.Msg) ([]services.Out, error) {
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), services.ErrHandlerTimeout) && ctx.Err() != context.Canceled {
				return nil, errors.New("cancelled for another cause")
			}
			if ret == nil {
				return nil, ctx.Err()
			}
			return nil, ret
		}
	}
	quick := func(ctx context.Context, _ *services.Msg) ([]services.Out, error) {
		if _, ok := ctx.Deadline(); !ok {
			return nil, errors.New("no deadline")
		}
		return []services.Out{{Subject: "out"}}, nil
	}
	for _, c := range []struct {
		name     string
		d        time.Duration
		h        services.Handler
		shutdown bool
		outs     int
		is       []error // the error is all of these; none: no error
		snoozed  bool
	}{
		{name: "in time", d: time.Minute, h: quick, outs: 1},
		{name: "no timeout: no deadline", d: 0, h: func(ctx context.Context, _ *services.Msg) ([]services.Out, error) {
			if _, ok := ctx.Deadline(); ok {
				return nil, errors.New("deadline")
			}
			return nil, nil
		}},
		{name: "past the deadline", d: time.Millisecond, h: waits(nil), is: []error{services.ErrHandlerTimeout, context.DeadlineExceeded}},
		{name: "the handler's own verdict stands", d: time.Millisecond, h: waits(services.Snooze(time.Second, errors.New("busy"))),
			is: []error{services.ErrHandlerTimeout}, snoozed: true},
		{name: "a success past the deadline stands", d: time.Millisecond, h: func(ctx context.Context, _ *services.Msg) ([]services.Out, error) {
			<-ctx.Done()
			return []services.Out{{Subject: "late"}}, nil
		}, outs: 1},
		{name: "shutdown is no timeout", d: time.Minute, h: waits(nil), shutdown: true, is: []error{context.Canceled}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.shutdown {
				cancel()
			}
			outs, err := services.Timeout(c.d)(c.h)(ctx, &services.Msg{})
			if len(outs) != c.outs || (err != nil) != (len(c.is) > 0) {
				t.Fatalf("outs %v, err %v", outs, err)
			}
			for _, target := range c.is {
				if !errors.Is(err, target) {
					t.Errorf("%v is not %v", err, target)
				}
			}
			if c.shutdown && errors.Is(err, services.ErrHandlerTimeout) {
				t.Errorf("a shutdown reported as a timeout: %v", err)
			}
			if _, snoozed := services.IsSnooze(err); snoozed != c.snoozed {
				t.Errorf("snoozed = %v", snoozed)
			}
		})
	}
}

// A handler past Spec.Timeout fails and its message is retried.
func TestRouterTimeoutRetries(t *testing.T) {
	s := setup(t)
	out := subscribe(t, s.NC, events.StageFilter("out"))
	sp := spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		if m.Delivered == 1 {
			<-ctx.Done() // a call that hangs
			return nil, ctx.Err()
		}
		o, err := services.Emit(events.TaskSubject("t1", "out"), "t1:1:out", "test.v1", "t1", m.Delivered)
		return []services.Out{o}, err
	})
	sp.Timeout = 100 * time.Millisecond
	run(t, s.JS, sp)
	publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
	if m := out(); string(m.Data) != "2" {
		t.Fatalf("output of delivery %s, want 2", m.Data)
	}
}
