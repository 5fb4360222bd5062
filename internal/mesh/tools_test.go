package mesh_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

var userTool = policy.Tool{Name: "create_user", Subject: "tools.users.create", Description: "Create a user account."}

// askTool is a model answer calling create_user.
func askTool(n int) openaitest.Reply {
	body, _ := json.Marshal(map[string]any{
		"id": fmt.Sprintf("chatcmpl-%d", n), "object": "chat.completion", "created": 1, "model": "gpt-4o",
		"choices": []map[string]any{{
			"index": 0, "finish_reason": "tool_calls",
			"message": map[string]any{"role": "assistant", "content": "", "tool_calls": []map[string]any{{
				"id": "call_1", "type": "function",
				"function": map[string]any{"name": userTool.Name, "arguments": `{"name":"Ann"}`},
			}}},
		}},
		"usage": map[string]any{"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
	})
	return openaitest.Reply{Body: string(body)}
}

// serveUserTool answers create_user on nc until the test ends.
func serveUserTool(t *testing.T, nc *nats.Conn) {
	t.Helper()
	svc, err := micro.AddService(nc, micro.Config{Name: "users", Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{Subject: userTool.Subject, Handler: micro.HandlerFunc(func(req micro.Request) {
			_ = req.Respond([]byte(`{"id":42}`))
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
}

// Tool outages cost nothing: the task waits while the tool has no
// responders, then resumes where it stopped — the model's paid turn is not
// sent again, one more model call finishes the task.
func TestToolOutageResumesInTheMesh(t *testing.T) {
	e := newEnv(t, func(n int, _ openaitest.Request) openaitest.Reply {
		if n == 1 {
			return askTool(n)
		}
		return openaitest.Reply{Content: openaitest.Success("created the user")}
	}, &policy.File{Types: map[string]policy.Type{"user_fix": {Tools: []policy.Tool{userTool}}}})
	e.start()
	id := e.submit(events.Submit{ID: "u1", Type: "user_fix", Subject: "ann"})

	// Waiting: snoozed twice, still one model call.
	deadline := time.Now().Add(patience)
	for {
		st, err := e.tasks.Get(context.Background(), id)
		if err == nil && st.Resume != nil && st.Resume.ToolWaits >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task never waited for its tool: %+v (%v)", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := e.model.Calls(); n != 1 {
		t.Fatalf("%d model calls while the tool was down, want 1", n)
	}
	serveUserTool(t, e.srv.NC)

	all := e.waitEnd(id)
	if got := last(all).Stage; got != events.StageSucceeded {
		t.Fatalf("ended with %s, want succeeded", got)
	}
	reqs := e.model.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model calls, want exactly 2", len(reqs))
	}
	var resumed struct {
		Messages []struct {
			Role       string `json:"role"`
			Content    string `json:"content"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID string `json:"id"`
			} `json:"tool_calls"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(reqs[1].Body, &resumed); err != nil {
		t.Fatal(err)
	}
	m := resumed.Messages
	if len(m) < 2 || m[len(m)-2].Role != "assistant" || len(m[len(m)-2].ToolCalls) != 1 || m[len(m)-1].ToolCallID != "call_1" || m[len(m)-1].Content != `{"id":42}` {
		t.Errorf("resumed request %s, want the earlier tool call and the tool's answer", reqs[1].Body)
	}
	st := e.state(id)
	if st.Attempts != 1 || st.Resume != nil || st.TokensIn != 200 || st.TokensOut != 100 {
		t.Errorf("state %+v, want one attempt billing both model calls once", st)
	}
}

// A tool that never answers: past the type's tool wait the task goes to a
// human, the reason naming the tool and its subject, and the type's trust
// is untouched.
func TestToolUnavailableGoesToAHuman(t *testing.T) {
	e := newEnv(t, func(n int, _ openaitest.Request) openaitest.Reply { return askTool(n) },
		&policy.File{Types: map[string]policy.Type{"user_fix": {Tools: []policy.Tool{userTool}, ToolWait: policy.Duration(time.Second)}}})
	e.start()
	id := e.submit(events.Submit{ID: "u1", Type: "user_fix", Subject: "ann"})
	if got := last(e.waitEnd(id)).Stage; got != "review.escalated" {
		t.Fatalf("ended with %s, want review.escalated", got)
	}
	st := e.state(id)
	const lead = "tool unavailable: create_user (subject tools.users.create) has not answered for "
	if st.Status != events.StatusBlocked || st.Attempts != 1 || !strings.HasPrefix(st.Reason, lead) || !strings.Contains(st.Reason, "HANDOFF") {
		t.Errorf("%s after %d attempts: %q; want blocked after 1, the reason leading with %q", st.Status, st.Attempts, st.Reason, lead)
	}
	if n := e.model.Calls(); n != 1 {
		t.Errorf("%d model calls, want 1", n)
	}
	view, err := trust.NewView(context.Background(), e.srv.JS, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Stop()
	if stats := view.Stats("user_fix"); len(stats.Outcomes) != 0 {
		t.Errorf("trust of user_fix %+v, want no outcome recorded", stats)
	}
}

// A tool wait — the default or a long one — ends the attempt well before
// the consumer's MaxDeliver does, even when every backoff draw is the
// shortest and the model's whole transient budget is spent in the same
// delivery sequence.
func TestToolWaitEndsBeforeMaxDeliver(t *testing.T) {
	srv := natstest.Start(t) // no responders on the tool's subject
	model := openaitest.New(t, func(n int, _ openaitest.Request) openaitest.Reply { return askTool(n) })
	for _, wait := range []time.Duration{0, 2 * time.Hour, 24 * time.Hour} {
		t.Run(fmt.Sprint(wait), func(t *testing.T) {
			var mu sync.Mutex
			now := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
			s, err := executor.New(executor.Config{
				Model: executor.NewOpenAI(executor.OpenAIConfig{BaseURL: model.BaseURL()}),
				Policy: policy.Static(&policy.File{Types: map[string]policy.Type{
					"user_fix": {Tools: []policy.Tool{userTool}, ToolWait: policy.Duration(wait)},
				}}),
				NATS: srv.NC, Log: quiet,
				Rand: func() float64 { return 0 }, // the shortest snoozes: the most deliveries
				Now:  func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
			})
			if err != nil {
				t.Fatal(err)
			}
			data, err := json.Marshal(events.Prompted{
				Base:   events.Base{Task: events.Task{ID: "u1", Type: "user_fix", Subject: "ann"}, Run: events.Run{Pass: 1, Attempt: 1}},
				Prompt: events.Prompt{Messages: []events.Message{{Role: "user", Content: "create Ann"}}},
			})
			if err != nil {
				t.Fatal(err)
			}
			want := wait
			if want == 0 {
				want = executor.DefaultToolWait
			}
			start := now
			for delivered := 1; ; delivered++ {
				outs, err := s.Handle(context.Background(), &services.Msg{Subject: events.TaskSubject("u1", events.StagePrompted), Data: data, Delivered: delivered})
				var snooze *services.SnoozeError
				if errors.As(err, &snooze) {
					mu.Lock()
					now = now.Add(snooze.Delay)
					mu.Unlock()
					if delivered+executor.DefaultTransientBudget >= mesh.ExecutorMaxDeliver {
						t.Fatalf("delivery %d and still waiting: MaxDeliver %d would end the wait first", delivered, mesh.ExecutorMaxDeliver)
					}
					continue
				}
				if err != nil || len(outs) != 1 {
					t.Fatalf("delivery %d: %d outputs, %v", delivered, len(outs), err)
				}
				var ev events.Executed
				if err := json.Unmarshal(outs[0].Data, &ev); err != nil {
					t.Fatal(err)
				}
				if ev.Result.ErrorClass != events.ErrorClassToolUnavailable || now.Sub(start) != want {
					t.Fatalf("delivery %d ended %+v after %v, want tool_unavailable after %v", delivered, ev.Result, now.Sub(start), want)
				}
				t.Logf("a tool wait of %v took %d deliveries (MaxDeliver %d)", want, delivered, mesh.ExecutorMaxDeliver)
				return
			}
		})
	}
}
