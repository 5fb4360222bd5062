package executor_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// callCost is what one scripted model answer (100 in, 50 out) costs on gpt-4o.
const callCost = (100*2.5 + 50*10) / 1e6

// A tool with no responders: the task waits — snoozed, no model call, no
// attempt — keeping the model's paid turn; once the tool answers, the loop
// goes on from there and the model is asked exactly once more, with its
// earlier tool call and the tool's answer.
func TestToolOutageResumesWithoutResendingPaidTurns(t *testing.T) {
	for _, store := range []string{"kv", "memory"} {
		t.Run(store, func(t *testing.T) {
			ns := natstest.Start(t) // nothing serves the tool's subject yet
			e := newEnv(t, sequence(
				toolCalls(1, [2]string{"create_user", `{"name":"Ann","email":"ann@example.com"}`}),
				ok("created the user"),
			), policy.Type{Tools: []policy.Tool{createUser}}, func(c *executor.Config) {
				c.NATS = ns.NC
				if store == "memory" {
					c.Tasks = nil
				}
			})

			for i, want := range []time.Duration{750 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second} {
				h := e.handle("t1", 1, testMessages)
				d := h.snooze(t)
				if d != want || !errors.Is(h.err, nats.ErrNoResponders) {
					t.Fatalf("wait %d: snooze %v (%v), want %v for no responders", i+1, d, h.err, want)
				}
				if n := e.model.Calls(); n != 1 {
					t.Fatalf("wait %d: %d model calls, want 1: waiting for a tool calls no model", i+1, n)
				}
				if store == "kv" {
					st := e.state("t1")
					r := st.Resume
					if r == nil || r.Pass != 1 || len(r.Turns) != 1 || r.Turns[0].Role != "assistant" || len(r.Pending) != 1 ||
						r.Pending[0].Name != "create_user" || r.ToolWaits != i+1 || !r.ToolWaitSince.Equal(testNow) || r.ToolCalls != 0 {
						t.Fatalf("wait %d: resume %+v, want the paid turn, its pending call and %d waits since %v", i+1, r, i+1, testNow)
					}
					if st.TransientRetries != 0 || st.Unbilled != (events.Usage{TokensIn: 100, TokensOut: 50, Cost: callCost}) || st.Status != events.StatusRunning {
						t.Fatalf("wait %d: state %+v, want running, no transient counted, the paid turn unbilled", i+1, st)
					}
				}
				e.clock.Advance(d)
			}
			if n := e.counter("dispatch_executor_snooze_seconds", map[string]string{"reason": "tool_wait"}); n != 3 {
				t.Errorf("%v tool_wait snoozes observed, want 3", n)
			}
			if n := e.counter("dispatch_executor_transient_retries_total", map[string]string{"endpoint": "tool:" + createUser.Subject}); n != 3 {
				t.Errorf("transient failures of the tool %v, want 3", n)
			}

			tool := startUserTool(t, ns.NC) // the tool comes up
			r := e.handle("t1", 1, testMessages).result(t)
			if r.Outcome != events.OutcomeSuccess || r.ToolCalls != 1 || r.TransientRetries != 0 {
				t.Errorf("result %+v, want a success after 1 tool call", r)
			}
			if r.TokensIn != 200 || r.TokensOut != 100 || r.Cost != 2*callCost {
				t.Errorf("tokens %d/%d cost %v, want the 2 model calls, each billed once", r.TokensIn, r.TokensOut, r.Cost)
			}
			if got := tool.requests(); len(got) != 1 {
				t.Errorf("the tool got %q, want the one pending call", got)
			}
			reqs := e.model.Requests()
			if len(reqs) != 2 {
				t.Fatalf("%d model calls, want exactly 2: the paid turn is not sent again", len(reqs))
			}
			msgs := decodeRequest(t, reqs[1]).Messages
			if len(msgs) != 4 || msgs[2].Role != "assistant" || len(msgs[2].ToolCalls) != 1 || msgs[2].ToolCalls[0].Function.Name != "create_user" ||
				msgs[2].ToolCalls[0].ID != "call_1_0" || msgs[3].Role != "tool" || msgs[3].ToolCallID != "call_1_0" || msgs[3].Content != `{"id":42}` {
				t.Errorf("resumed request %s, want the prompt, the earlier tool call and the tool's answer", reqs[1].Body)
			}
			if store == "kv" {
				// its spend is billed by the Result (unbilled until recorded)
				if st := e.state("t1"); st.Resume != nil || st.Unbilled != (events.Usage{TokensIn: 100, TokensOut: 50, Cost: callCost}) {
					t.Errorf("state after the attempt %+v, want the loop settled and the cut-short try's spend unbilled until recorded", st)
				}
			}
		})
	}
}

// A tool that stays unavailable: the attempt waits for it — neither
// calling the model again nor spending the transient budget — up to the
// type's tool wait, then fails for a human naming the tool and its subject.
func TestToolUnavailableHandsOffAfterTheWait(t *testing.T) {
	ns := natstest.Start(t)
	e := newEnv(t, always(toolCalls(1, [2]string{"create_user", `{"name":"Ann","email":"ann@example.com"}`})),
		policy.Type{Tools: []policy.Tool{createUser}, ToolWait: policy.Duration(time.Minute), TransientBudget: 1},
		func(c *executor.Config) { c.NATS = ns.NC })
	snoozes := 0
	var r events.Result
	for {
		h := e.handle("t1", 1, testMessages)
		if h.err == nil {
			r = h.result(t)
			break
		}
		e.clock.Advance(h.snooze(t))
		if snoozes++; snoozes > 50 {
			t.Fatal("still waiting after 50 snoozes")
		}
	}
	if waited := e.clock.Now().Sub(testNow); waited != time.Minute {
		t.Errorf("gave up after %v on the test clock, want the tool wait, 1m (the last snooze ends at the bound)", waited)
	}
	if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassToolUnavailable || !events.ShortCircuits(r.ErrorClass) || !events.DeploymentFault(r.ErrorClass) {
		t.Errorf("result %+v, want a tool_unavailable failure (short-circuits, the deployment's fault)", r)
	}
	const lead = "tool unavailable: create_user (subject tools.users.create) has not answered for 1m0s (no responders) — start the service that answers tools.users.create"
	if !strings.HasPrefix(r.Error, lead) || !strings.Contains(r.Error, "no responders available") {
		t.Errorf("error %q, want it to start with %q and carry the last error", r.Error, lead)
	}
	if n := e.model.Calls(); n != 1 {
		t.Errorf("%d model calls, want 1", n)
	}
	if r.TokensIn != 100 || r.TokensOut != 50 || r.TransientRetries != 0 || r.ToolCalls != 0 {
		t.Errorf("result %+v, want the one model call billed, no transient and no tool call counted", r)
	}
	if st := e.state("t1"); st.Resume != nil || st.Unbilled != (events.Usage{TokensIn: 100, TokensOut: 50, Cost: callCost}) || st.TransientRetries != 0 {
		t.Errorf("state %+v, want the loop settled, its paid turn unbilled until the Result is recorded", st)
	}
	if n := e.counter("dispatch_executor_errors_total", map[string]string{"class": string(events.ErrorClassToolUnavailable)}); n != 1 {
		t.Errorf("tool_unavailable errors %v, want 1", n)
	}
}

// slowTool answers lookups at once, except the first "slow" one, which it
// holds until release is closed: the caller has timed out by then.
type slowTool struct {
	release chan struct{}
	got     chan string // each request's arguments, as it arrives

	mu   sync.Mutex
	args []string
	held bool
}

// lookup times out after 2s: long enough for any answer, short for a held one.
var lookup = policy.Tool{Name: "lookup", Subject: "tools.lookup", Timeout: policy.Duration(2 * time.Second)}

func startSlowTool(t *testing.T, nc *nats.Conn) *slowTool {
	t.Helper()
	s := &slowTool{release: make(chan struct{}), got: make(chan string, 16)}
	svc, err := micro.AddService(nc, micro.Config{Name: "lookup", Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{Subject: lookup.Subject, Handler: micro.HandlerFunc(func(req micro.Request) {
			args := string(req.Data())
			s.mu.Lock()
			s.args = append(s.args, args)
			hold := strings.Contains(args, "slow") && !s.held
			s.held = s.held || hold
			s.mu.Unlock()
			s.got <- args
			if hold {
				<-s.release
			}
			_ = req.Respond([]byte(`{"found":` + args + `}`))
		})},
	})
	if err != nil {
		t.Fatalf("micro service: %v", err)
	}
	t.Cleanup(func() {
		select {
		case <-s.release:
		default:
			close(s.release)
		}
		_ = svc.Stop()
	})
	return s
}

func (s *slowTool) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.args)
}

// A tool that times out in the middle of a loop: the calls already answered
// are kept, only the pending one is asked again, then the model once more.
func TestToolTimeoutMidLoopResumes(t *testing.T) {
	ns := natstest.Start(t)
	tool := startSlowTool(t, ns.NC)
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"lookup", `{"q":"fast"}`}, [2]string{"lookup", `{"q":"slow"}`}),
		ok("looked both up"),
	), policy.Type{Tools: []policy.Tool{lookup}}, func(c *executor.Config) { c.NATS = ns.NC })

	h := e.handle("t1", 1, testMessages)
	if d := h.snooze(t); !errors.Is(h.err, context.DeadlineExceeded) {
		t.Fatalf("snooze %v (%v), want a wait for the timed-out tool", d, h.err)
	}
	r := e.state("t1").Resume
	if r == nil || len(r.Turns) != 2 || r.Turns[1].Role != "tool" || r.Turns[1].Content != `{"found":{"q":"fast"}}` ||
		len(r.Pending) != 1 || r.Pending[0].Arguments != `{"q":"slow"}` || r.ToolCalls != 1 {
		t.Fatalf("resume %+v, want the answered call kept and the slow one pending", r)
	}
	close(tool.release)

	res := e.handle("t1", 1, testMessages).result(t)
	if res.Outcome != events.OutcomeSuccess || res.ToolCalls != 2 || res.TokensIn != 200 {
		t.Errorf("result %+v, want a success after 2 tool calls and 2 model calls", res)
	}
	if got := tool.requests(); !slices.Equal(got, []string{`{"q":"fast"}`, `{"q":"slow"}`, `{"q":"slow"}`}) {
		t.Errorf("the tool got %q, want fast once and slow again, not fast again", got)
	}
	reqs := e.model.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model calls, want 2", len(reqs))
	}
	msgs := decodeRequest(t, reqs[1]).Messages
	if len(msgs) != 5 || len(msgs[2].ToolCalls) != 2 || msgs[3].ToolCallID != "call_1_0" || msgs[4].ToolCallID != "call_1_1" ||
		msgs[4].Content != `{"found":{"q":"slow"}}` {
		t.Errorf("resumed request %s, want both calls answered in order", reqs[1].Body)
	}
}

// A model call failing transiently after a tool answered: the redelivery
// sends that identical request, not the conversation from its start.
func TestModelTransientMidLoopResumes(t *testing.T) {
	ns := natstest.Start(t)
	tool := startUserTool(t, ns.NC)
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"create_user", `{"name":"Ann","email":"ann@example.com"}`}),
		status(http.StatusServiceUnavailable, unavailable),
		ok("created the user"),
	), policy.Type{Tools: []policy.Tool{createUser}}, func(c *executor.Config) { c.NATS = ns.NC })

	if d := e.handle("t1", 1, testMessages).snooze(t); d != 500*time.Millisecond {
		t.Errorf("snooze %v, want the model's first backoff", d)
	}
	if st := e.state("t1"); st.TransientRetries != 1 || st.Resume == nil || len(st.Resume.Turns) != 2 || len(st.Resume.Pending) != 0 {
		t.Fatalf("state %+v, want 1 transient and the loop kept with the tool's answer", st)
	}
	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.TransientRetries != 1 || r.ToolCalls != 1 || r.TokensIn != 200 || r.Cost != 2*callCost {
		t.Errorf("result %+v, want a success billing the 2 answers once", r)
	}
	reqs := e.model.Requests()
	if len(reqs) != 3 || !bytes.Equal(reqs[1].Body, reqs[2].Body) {
		t.Fatalf("%d model calls, want 3, the last identical to the one that failed", len(reqs))
	}
	if n := len(tool.requests()); n != 1 {
		t.Errorf("the tool got %d calls, want 1", n)
	}
}

// Shutdown in the middle of a tool call keeps the loop too.
func TestToolLoopCutShortByShutdownResumes(t *testing.T) {
	ns := natstest.Start(t)
	tool := startSlowTool(t, ns.NC)
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"lookup", `{"q":"slow"}`}),
		ok("looked it up"),
	), policy.Type{Tools: []policy.Tool{{Name: lookup.Name, Subject: lookup.Subject}}}, func(c *executor.Config) { c.NATS = ns.NC })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan handled, 1)
	go func() {
		done <- e.handleCtx(ctx, "t1", events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}, testMessages)
	}()
	<-tool.got // the tool holds the call
	cancel()
	if h := <-done; !errors.Is(h.err, context.Canceled) || h.outs != nil {
		t.Fatalf("Handle = %v, %v; want the shutdown's error and nothing published", h.outs, h.err)
	}
	st := e.state("t1")
	if st.Resume == nil || len(st.Resume.Pending) != 1 || st.Unbilled != (events.Usage{TokensIn: 100, TokensOut: 50, Cost: callCost}) || st.TransientRetries != 0 {
		t.Fatalf("state %+v, want the loop and its paid turn kept", st)
	}
	close(tool.release)

	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.TokensIn != 200 || r.ToolCalls != 1 {
		t.Errorf("result %+v, want a success billing both model calls once", r)
	}
	if n := e.model.Calls(); n != 2 {
		t.Errorf("%d model calls, want 2", n)
	}
}

// A resumed loop refuses a tool call that failed deterministically earlier
// in the same attempt, as the try that saw it fail would have.
func TestResumedLoopRefusesACallThatFailedEarlierInTheAttempt(t *testing.T) {
	ns := natstest.Start(t)
	tool := startUserTool(t, ns.NC)
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"create_user", `{"name":"Ann"}`}), // 400: no email
		status(http.StatusServiceUnavailable, unavailable),
		toolCalls(3, [2]string{"create_user", `{"name":"Ann"}`}), // the same call again
		ok("gave up on the user"),
	), policy.Type{Tools: []policy.Tool{createUser}}, func(c *executor.Config) { c.NATS = ns.NC })

	e.handle("t1", 1, testMessages).snooze(t)
	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.ToolCalls != 2 || r.ToolRefusals != 1 {
		t.Errorf("result %+v, want 2 tool calls, the repeat refused", r)
	}
	if n := len(tool.requests()); n != 1 {
		t.Errorf("the tool got %d calls, want 1: the repeat is refused before it is sent", n)
	}
	reqs := e.model.Requests()
	if len(reqs) != 4 {
		t.Fatalf("%d model calls, want 4", len(reqs))
	}
	if got := lastTool(t, reqs[3]); !strings.Contains(got, `"refused":true`) || !strings.Contains(got, "earlier in this attempt") {
		t.Errorf("refusal %s, want it to say the call failed earlier in this attempt", got)
	}
}
