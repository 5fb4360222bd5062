package executor_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// heldCall wraps a model: its call number at signals started and is held
// until the call's context ends — a human's cancel heard by the executor.
// Then, with answered, the answer comes anyway (it was on its way when the
// cancel came); without, the call ends with the context's error, as an
// HTTP call cut short does, and nothing is known of its usage.
type heldCall struct {
	executor.Model
	at       int
	answered bool
	calls    int
	started  chan struct{}
}

func (m *heldCall) Complete(ctx context.Context, req executor.Request) (executor.Response, error) {
	m.calls++
	if m.calls != m.at {
		return m.Model.Complete(ctx, req)
	}
	close(m.started)
	<-ctx.Done()
	if !m.answered {
		return executor.Response{}, ctx.Err()
	}
	return m.Model.Complete(context.WithoutCancel(ctx), req)
}

// cancelByHuman cancels task id as review.Cancel does: the state first,
// then the action on dispatch.review.action.<id>, where the executor hears it.
func (e *env) cancelByHuman(nc *nats.Conn, id string) {
	e.t.Helper()
	a := events.Action{TaskID: id, Action: events.ActionCancel, By: "alice", At: testNow}
	if _, err := e.tasks.Update(context.Background(), id, func(cur *events.TaskState, found bool) error {
		*cur = task.Act(*cur, a)
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	data, err := json.Marshal(a)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := nc.Publish(events.ReviewSubject(events.ReviewAction, id), data); err != nil {
		e.t.Fatal(err)
	}
}

// wait receives from ch.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second): // a deadlock guard
		t.Fatalf("waited 30s for %s", what)
		panic("unreachable")
	}
}

// dropped checks that Handle published nothing and asked for no redelivery:
// the attempt a cancel cut short is neither recorded nor retried.
func (h handled) dropped(t *testing.T) {
	t.Helper()
	if h.err != nil || h.outs != nil {
		t.Fatalf("Handle = %d outputs, %v; want the call dropped: nothing published, no redelivery", len(h.outs), h.err)
	}
}

// A human cancels a task while its one model call is in flight: the HTTP
// request is cut short and nothing is known of what it spent, so nothing is
// recorded — no tokens, no cost, no estimate, in the state or the metrics.
func TestCancelMidCallRecordsNothingUnknown(t *testing.T) {
	ns := natstest.Start(t)
	e := newEnv(t, always(ok("never recorded")), policy.Type{}, func(c *executor.Config) { c.NATS = ns.NC })
	e.model.Started = make(chan openaitest.Request, 1)
	e.model.Block = make(chan struct{})
	e.model.Cancelled = make(chan openaitest.Request, 1)
	defer close(e.model.Block)

	done := make(chan handled, 1)
	go func() { done <- e.handle("t1", 1, testMessages) }()
	wait(t, e.model.Started, "the model call")
	e.cancelByHuman(ns.NC, "t1")
	wait(t, e.model.Cancelled, "the model's request to be cut short")
	wait(t, done, "Handle").dropped(t)

	st := e.state("t1")
	if st.Status != events.StatusCancelled || st.Unbilled != (events.Usage{}) || st.TokensIn != 0 || st.TokensOut != 0 || st.Cost != 0 {
		t.Fatalf("state %+v, want cancelled with nothing spent", st)
	}
	if n := e.counter("dispatch_executor_tokens_total", nil); n != 0 {
		t.Errorf("%v tokens counted, want none: the call's usage is unknown", n)
	}
	if n := e.model.Calls(); n != 1 {
		t.Errorf("%d model calls, want 1", n)
	}
}

// A human cancels a task while the second model call of its tool loop is in
// flight: the first call's answer, paid for, stays in the task's spend
// (TaskState.Unbilled, as for a try a transient failure cuts short) and in
// the usage metrics; the call cut short adds nothing.
func TestCancelMidToolLoopKeepsThePaidTurn(t *testing.T) {
	ns := natstest.Start(t)
	startUserTool(t, ns.NC)
	held := &heldCall{at: 2, started: make(chan struct{})}
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"create_user", `{"name":"Ann","email":"ann@example.com"}`}),
		ok("never asked"),
	), policy.Type{Tools: []policy.Tool{createUser}}, func(c *executor.Config) {
		c.NATS = ns.NC
		held.Model = c.Model
		c.Model = held
	})

	done := make(chan handled, 1)
	go func() { done <- e.handle("t1", 1, testMessages) }()
	wait(t, held.started, "the second model call")
	e.cancelByHuman(ns.NC, "t1")
	wait(t, done, "Handle").dropped(t)

	st := e.state("t1")
	if st.Status != events.StatusCancelled || st.Unbilled != (events.Usage{TokensIn: 100, TokensOut: 50, Cost: callCost}) || st.Resume != nil || st.Attempts != 0 {
		t.Fatalf("state %+v, want cancelled, no attempt, no loop to resume, and the paid turn's spend kept", st)
	}
	if in, out := e.counter("dispatch_executor_tokens_total", map[string]string{"direction": "in"}),
		e.counter("dispatch_executor_tokens_total", map[string]string{"direction": "out"}); in != 100 || out != 50 {
		t.Errorf("tokens counted in %v, out %v; want the paid turn's 100 and 50", in, out)
	}
	if n := e.model.Calls(); n != 1 {
		t.Errorf("%d model calls reached the model, want 1", n)
	}
}

// The model answers just as a human cancels: the attempt's Result is
// dropped, but what it billed — its answer and the turn an earlier try paid
// for before a 503 — is kept as the task's spend, not lost with it.
func TestCancelAsTheModelAnswersKeepsTheAttemptsSpend(t *testing.T) {
	ns := natstest.Start(t)
	tool := startUserTool(t, ns.NC)
	held := &heldCall{at: 3, answered: true, started: make(chan struct{})}
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"create_user", `{"name":"Ann","email":"ann@example.com"}`}),
		status(http.StatusServiceUnavailable, unavailable),
		ok("created the user"),
	), policy.Type{Tools: []policy.Tool{createUser}}, func(c *executor.Config) {
		c.NATS = ns.NC
		held.Model = c.Model
		c.Model = held
	})

	e.handle("t1", 1, testMessages).snooze(t)
	paid := events.Usage{TokensIn: 100, TokensOut: 50, Cost: callCost}
	if st := e.state("t1"); st.Unbilled != paid {
		t.Fatalf("after the 503: unbilled %+v, want the first answer's %+v", st.Unbilled, paid)
	}

	done := make(chan handled, 1)
	go func() { done <- e.handle("t1", 1, testMessages) }()
	wait(t, held.started, "the resumed model call")
	e.cancelByHuman(ns.NC, "t1")
	wait(t, done, "Handle").dropped(t)

	st := e.state("t1")
	if want := paid.Add(paid); st.Status != events.StatusCancelled || st.Unbilled != want || st.Resume != nil || st.Attempts != 0 {
		t.Fatalf("state %+v, want cancelled, no attempt, and both answers' spend %+v kept", st, want)
	}
	if in := e.counter("dispatch_executor_tokens_total", map[string]string{"direction": "in"}); in != 200 {
		t.Errorf("tokens in counted %v, want both answers' 200", in)
	}
	if n, m := e.model.Calls(), len(tool.requests()); n != 3 || m != 1 {
		t.Errorf("%d model calls and %d tool calls, want 3 and 1", n, m)
	}
}

// The one call of an attempt is answered just as a human cancels: the
// attempt concludes — a success, nothing to settle — and its Result is
// dropped; its spend is kept.
func TestCancelAsTheOnlyCallAnswersKeepsItsSpend(t *testing.T) {
	ns := natstest.Start(t)
	held := &heldCall{at: 1, answered: true, started: make(chan struct{})}
	e := newEnv(t, always(ok("fixed, too late")), policy.Type{}, func(c *executor.Config) {
		c.NATS = ns.NC
		held.Model = c.Model
		c.Model = held
	})

	done := make(chan handled, 1)
	go func() { done <- e.handle("t1", 1, testMessages) }()
	wait(t, held.started, "the model call")
	e.cancelByHuman(ns.NC, "t1")
	wait(t, done, "Handle").dropped(t)

	st := e.state("t1")
	if want := (events.Usage{TokensIn: 100, TokensOut: 50, Cost: callCost}); st.Status != events.StatusCancelled || st.Unbilled != want || st.Attempts != 0 {
		t.Fatalf("state %+v, want cancelled, no attempt, and the answer's spend %+v kept", st, want)
	}
	if in := e.counter("dispatch_executor_tokens_total", map[string]string{"direction": "in"}); in != 100 {
		t.Errorf("tokens in counted %v, want the answer's 100", in)
	}
}

// endsAfter wraps a model: its answer comes, then the handler's context
// ends (a shutdown right after a paid answer).
type endsAfter struct {
	executor.Model
	end context.CancelFunc
}

func (m endsAfter) Complete(ctx context.Context, req executor.Request) (executor.Response, error) {
	resp, err := m.Model.Complete(ctx, req)
	m.end()
	return resp, err
}

// A paid answer that came in before a shutdown is kept: the attempt's
// state is settled and its Result returned, not thrown away with the
// context (the next delivery would pay for it again).
func TestAnswerBeforeShutdownIsKept(t *testing.T) {
	ctx, end := context.WithCancel(context.Background())
	defer end()
	e := newEnv(t, always(ok("x")), policy.Type{}, func(c *executor.Config) {
		c.Model = endsAfter{Model: c.Model, end: end}
	})
	e.edit("t1", func(st *events.TaskState) {
		st.ID, st.Type, st.Status, st.Pass, st.TransientRetries = "t1", "css_fix", events.StatusRunning, 1, 2 // two tries failed transiently
	})
	r := e.handleCtx(ctx, "t1", events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Step: "execute"}, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.TransientRetries != 2 {
		t.Fatalf("result %+v, want the success the answer said, after 2 transient failures", r)
	}
	if st := e.state("t1"); st.TransientRetries != 0 {
		t.Fatalf("transient retries %d after the attempt, want it settled", st.TransientRetries)
	}
}
