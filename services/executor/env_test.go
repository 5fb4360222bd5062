package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// clock is a test clock that only moves when told to.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is an executor wired to a scripted OpenAI server, a real task store
// on embedded JetStream, a test clock and its own metrics registry.
type env struct {
	*executor.Service
	t     *testing.T
	model *openaitest.Server
	tasks *services.TaskStore
	clock *clock
	reg   *prometheus.Registry
}

// newEnv builds the env; pol is the policy of type "css_fix" (model gpt-4o
// unless it names another), cfg tweaks the configuration.
func newEnv(t *testing.T, script openaitest.Script, pol policy.Type, cfg func(*executor.Config)) *env {
	t.Helper()
	if pol.Model == "" {
		pol.Model = "gpt-4o"
	}
	e := &env{t: t, model: openaitest.New(t, script), tasks: taskStore(t), clock: &clock{now: testNow}, reg: prometheus.NewRegistry()}
	c := executor.Config{
		Model:    executor.NewOpenAI(executor.OpenAIConfig{BaseURL: e.model.BaseURL(), APIKey: "sk-test"}),
		Policy:   policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": pol}}),
		Prices:   prices,
		Tasks:    e.tasks,
		Instance: "executor@test",
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:      e.clock.Now,
		Rand:     func() float64 { return 0.5 },
		Registry: e.reg,
	}
	if cfg != nil {
		cfg(&c)
	}
	s, err := executor.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.Service = s
	return e
}

// handled is what one Handle returned.
type handled struct {
	outs []services.Out
	err  error
}

// handle runs one Prompted of task id on the given pass with msgs.
func (e *env) handle(id string, pass int, msgs []events.Message) handled {
	e.t.Helper()
	return e.handleRun(id, events.Run{Pass: pass, Attempt: pass, Rung: events.RungRefine, Step: "execute"}, msgs)
}

func (e *env) handleRun(id string, run events.Run, msgs []events.Message) handled {
	e.t.Helper()
	return e.handleCtx(context.Background(), id, run, msgs)
}

func (e *env) handleCtx(ctx context.Context, id string, run events.Run, msgs []events.Message) handled {
	e.t.Helper()
	return e.deliver(ctx, id, run, msgs, 1)
}

// redeliver runs the Prompted of task id on pass again, as the server
// redelivers it (its second delivery).
func (e *env) redeliver(id string, pass int, msgs []events.Message) handled {
	e.t.Helper()
	return e.deliver(context.Background(), id, events.Run{Pass: pass, Attempt: pass, Rung: events.RungRefine, Step: "execute"}, msgs, 2)
}

func (e *env) deliver(ctx context.Context, id string, run events.Run, msgs []events.Message, delivered int) handled {
	e.t.Helper()
	in := events.Prompted{
		Base:   events.Base{Task: events.Task{ID: id, Type: "css_fix", Subject: "app.css"}, Run: run, At: testNow, By: "prompt@test"},
		Prompt: events.Prompt{Messages: msgs},
	}
	data, err := json.Marshal(in)
	if err != nil {
		e.t.Fatal(err)
	}
	outs, err := e.Handle(ctx, &services.Msg{Subject: events.TaskSubject(id, events.StagePrompted), Data: data, Delivered: delivered})
	return handled{outs, err}
}

// edit changes task id's stored state (created when absent) with fn.
func (e *env) edit(id string, fn func(st *events.TaskState)) {
	e.t.Helper()
	if _, err := e.tasks.Update(context.Background(), id, func(st *events.TaskState, _ bool) error { fn(st); return nil }); err != nil {
		e.t.Fatal(err)
	}
}

// state is the task's stored state.
func (e *env) state(id string) events.TaskState {
	e.t.Helper()
	st, err := e.tasks.Get(context.Background(), id)
	if err != nil {
		e.t.Fatalf("task %s: %v", id, err)
	}
	return st
}

// result decodes the one Executed Handle returned.
func (h handled) result(t *testing.T) events.Result {
	t.Helper()
	outs, err := h.outs, h.err
	if err != nil {
		t.Fatalf("Handle: %v, want an Executed", err)
	}
	if len(outs) != 1 || outs[0].Header.Get(events.HeaderEvent) != events.EventExecuted {
		t.Fatalf("got %d outputs, want one Executed", len(outs))
	}
	var ev events.Executed
	if err := json.Unmarshal(outs[0].Data, &ev); err != nil {
		t.Fatal(err)
	}
	return ev.Result
}

// snooze checks that Handle asked for a snooze and returns its delay.
func (h handled) snooze(t *testing.T) time.Duration {
	t.Helper()
	outs, err := h.outs, h.err
	var s *services.SnoozeError
	if !errors.As(err, &s) || outs != nil {
		t.Fatalf("Handle = %d outputs, %v; want a snooze and nothing published", len(outs), err)
	}
	return s.Delay
}

// counter sums a metric's samples whose labels include want.
func (e *env) counter(name string, want map[string]string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// Scripted replies.

func ok(approach string) openaitest.Reply {
	return openaitest.Reply{Content: openaitest.Success(approach)}
}

func status(code int, body string, header ...string) openaitest.Reply {
	r := openaitest.Reply{Status: code, Body: body}
	if len(header) == 2 {
		r.Header = http.Header{header[0]: {header[1]}}
	}
	return r
}

// toolCalls is a 200 answer asking for the given calls (name, arguments pairs).
func toolCalls(n int, calls ...[2]string) openaitest.Reply {
	var tcs []map[string]any
	for i, c := range calls {
		tcs = append(tcs, map[string]any{
			"id": fmt.Sprintf("call_%d_%d", n, i), "type": "function",
			"function": map[string]any{"name": c[0], "arguments": c[1]},
		})
	}
	body, _ := json.Marshal(map[string]any{
		"id": fmt.Sprintf("chatcmpl-%d", n), "object": "chat.completion", "created": 1, "model": "gpt-4o",
		"choices": []map[string]any{{
			"index": 0, "finish_reason": "tool_calls",
			"message": map[string]any{"role": "assistant", "content": "", "tool_calls": tcs},
		}},
		"usage": map[string]any{"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
	})
	return openaitest.Reply{Body: string(body)}
}

// always answers every call with r.
func always(r openaitest.Reply) openaitest.Script {
	return func(int, openaitest.Request) openaitest.Reply { return r }
}

// sequence answers the n-th call with rs[n-1], then 500s.
func sequence(rs ...openaitest.Reply) openaitest.Script {
	return func(n int, _ openaitest.Request) openaitest.Reply {
		if n <= len(rs) {
			return rs[n-1]
		}
		return status(500, `{"error":{"message":"no reply scripted","type":"server_error"}}`)
	}
}
