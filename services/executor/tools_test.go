package executor_test

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// userTool is a NATS micro endpoint that creates a user and answers a
// missing field with a teaching 400: the field, the keys received and the
// keys expected. It records every request it gets.
type userTool struct {
	mu   sync.Mutex
	args []string
}

func (u *userTool) handle(req micro.Request) {
	u.mu.Lock()
	u.args = append(u.args, string(req.Data()))
	u.mu.Unlock()
	var in map[string]any
	if err := json.Unmarshal(req.Data(), &in); err != nil {
		_ = req.Error("400", "arguments are not JSON", nil)
		return
	}
	if _, ok := in["email"]; !ok {
		keys := make([]string, 0, len(in))
		for k := range in {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		body, _ := json.Marshal(map[string]any{
			"error": "missing_required_field", "field": "email",
			"received_keys": keys, "expected_keys": []string{"email", "name"},
		})
		_ = req.Error("400", "missing required field", body)
		return
	}
	_ = req.Respond([]byte(`{"id":42}`))
}

func (u *userTool) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.args)
}

var createUser = policy.Tool{
	Name: "create_user", Subject: "tools.users.create", Description: "Create a user account.",
	Parameters: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"},"email":{"type":"string"}},"required":["name","email"]}`),
}

// startUserTool serves createUser on a real NATS server.
func startUserTool(t *testing.T, nc *nats.Conn) *userTool {
	t.Helper()
	u := &userTool{}
	svc, err := micro.AddService(nc, micro.Config{
		Name: "users", Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{Subject: createUser.Subject, Handler: micro.HandlerFunc(u.handle)},
	})
	if err != nil {
		t.Fatalf("micro service: %v", err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	return u
}

// chatBody is the part of a chat-completions body the tool tests read.
type chatBody struct {
	Messages []struct {
		Role       string `json:"role"`
		Content    string `json:"content"`
		ToolCallID string `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	ToolChoice any `json:"tool_choice"`
}

func decodeRequest(t *testing.T, r openaitest.Request) chatBody {
	t.Helper()
	var s chatBody
	if err := json.Unmarshal(r.Body, &s); err != nil {
		t.Fatalf("request body: %v", err)
	}
	return s
}

// lastTool is the content of the last tool message of a request.
func lastTool(t *testing.T, r openaitest.Request) string {
	t.Helper()
	msgs := decodeRequest(t, r).Messages
	if len(msgs) == 0 || msgs[len(msgs)-1].Role != "tool" {
		t.Fatalf("request does not end with a tool message: %s", r.Body)
	}
	return msgs[len(msgs)-1].Content
}

func TestToolErrorReachesTheModelAndIdenticalCallsAreRefused(t *testing.T) {
	ns := natstest.Start(t)
	tool := startUserTool(t, ns.NC)
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"create_user", `{"name":"Ann"}`}),
		toolCalls(2, [2]string{"create_user", "{ \"name\" : \"Ann\" }"}), // same call, other spelling
		toolCalls(3, [2]string{"create_user", `{"name":"Ann","email":"ann@example.com"}`}),
		ok("created the user with an email"),
	), policy.Type{Tools: []policy.Tool{createUser}}, func(c *executor.Config) { c.NATS = ns.NC })

	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.ToolCalls != 3 || r.ToolRefusals != 1 {
		t.Errorf("result %+v, want a success after 3 tool calls, 1 refused", r)
	}
	if r.TokensIn != 4*100 || r.TokensOut != 4*50 || r.Cost != 4*(100*2.5+50*10)/1e6 {
		t.Errorf("tokens %d/%d cost %v, want the sum over the 4 model calls", r.TokensIn, r.TokensOut, r.Cost)
	}
	if got := tool.requests(); len(got) != 2 || got[0] != `{"name":"Ann"}` || !strings.Contains(got[1], "ann@example.com") {
		t.Fatalf("the tool got %q, want the first call and the changed one, not the repeat", got)
	}

	reqs := e.model.Requests()
	if len(reqs) != 4 {
		t.Fatalf("%d model calls, want 4", len(reqs))
	}
	first := decodeRequest(t, reqs[0])
	if len(first.Tools) != 1 || first.Tools[0].Function.Name != "create_user" || first.Tools[0].Function.Description != createUser.Description ||
		!strings.Contains(string(first.Tools[0].Function.Parameters), `"required":["name","email"]`) {
		t.Errorf("tools offered %+v, want create_user with its description and schema", first.Tools)
	}
	// the error reaches the model in full
	var toolErr struct {
		Error struct {
			Tool        string `json:"tool"`
			Code        int    `json:"code"`
			Description string `json:"description"`
			Class       string `json:"class"`
			Body        struct {
				Error        string   `json:"error"`
				Field        string   `json:"field"`
				ReceivedKeys []string `json:"received_keys"`
				ExpectedKeys []string `json:"expected_keys"`
			} `json:"body"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(lastTool(t, reqs[1])), &toolErr); err != nil {
		t.Fatalf("tool error message: %v", err)
	}
	te := toolErr.Error
	if te.Tool != "create_user" || te.Code != 400 || te.Description != "missing required field" || te.Class != string(events.ErrorClassDeterministic) ||
		te.Body.Field != "email" || !slices.Equal(te.Body.ReceivedKeys, []string{"name"}) || !slices.Equal(te.Body.ExpectedKeys, []string{"email", "name"}) {
		t.Errorf("tool error as the model saw it: %+v", te)
	}
	// the repeat is refused, and the model is told so with the last error
	refusal := lastTool(t, reqs[2])
	if !strings.Contains(refusal, `"refused":true`) || !strings.Contains(refusal, "arguments must change") || !strings.Contains(refusal, `"field":"email"`) {
		t.Errorf("refusal message %s, want a refusal naming the change and the last error", refusal)
	}
	if got := lastTool(t, reqs[3]); got != `{"id":42}` {
		t.Errorf("tool result %q, want the tool's reply", got)
	}
	// the assistant's calls are in the conversation, answered by id
	msgs := decodeRequest(t, reqs[3]).Messages
	if len(msgs) != 2+3*2 || msgs[2].Role != "assistant" || len(msgs[2].ToolCalls) != 1 || msgs[3].ToolCallID != msgs[2].ToolCalls[0].ID {
		t.Errorf("conversation %+v, want prompt + 3 × (assistant call, tool answer)", msgs)
	}

	st := e.state("t1")
	if len(st.FailedRequests) != 1 || st.FailedRequests[0] != task.FailedEntry(executor.ToolCallHash("create_user", `{"name":"Ann"}`), 1) {
		t.Errorf("failed requests %v, want the failed tool call's hash", st.FailedRequests)
	}
	if c, ref := e.counter("dispatch_executor_tool_calls_total", map[string]string{"tool": "create_user"}),
		e.counter("dispatch_executor_tool_refusals_total", map[string]string{"tool": "create_user"}); c != 3 || ref != 1 {
		t.Errorf("tool metrics calls %v refusals %v, want 3 and 1", c, ref)
	}
}

func TestFailedToolCallStaysRefusedAcrossAttempts(t *testing.T) {
	ns := natstest.Start(t)
	tool := startUserTool(t, ns.NC)
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"create_user", `{"name":"Ann"}`}),
		ok("gave up"),
		toolCalls(3, [2]string{"create_user", `{"name":"Ann"}`}),
		ok("gave up again"),
	), policy.Type{Tools: []policy.Tool{createUser}}, func(c *executor.Config) { c.NATS = ns.NC })
	e.handle("t1", 1, testMessages).result(t)
	changed := append(slices.Clone(testMessages), events.Message{Role: "user", Content: "attempt 2"})
	if r := e.handle("t1", 2, changed).result(t); r.ToolRefusals != 1 {
		t.Errorf("result %+v, want the repeated call refused", r)
	}
	if n := len(tool.requests()); n != 1 {
		t.Errorf("the tool got %d requests, want 1", n)
	}
	if got := lastTool(t, e.model.Requests()[3]); !strings.Contains(got, "earlier attempt") {
		t.Errorf("refusal %s, want it to say the call failed in an earlier attempt", got)
	}
}

func TestToolsOffered(t *testing.T) {
	ns := natstest.Start(t)
	search := policy.Tool{Name: "search_docs", Subject: "tools.docs.search"}
	pol := policy.Type{Tools: []policy.Tool{createUser}, ResearchTools: []policy.Tool{search}}
	tests := []struct {
		name string
		rung events.Rung
		nc   bool
		want []string
	}{
		{"refine", events.RungRefine, true, []string{"create_user"}},
		{"research", events.RungResearch, true, []string{"create_user", "search_docs"}},
		{"no NATS", events.RungResearch, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, always(ok("a")), pol, func(c *executor.Config) {
				if tt.nc {
					c.NATS = ns.NC
				}
			})
			e.handleRun("t1", events.Run{Pass: 1, Attempt: 5, Rung: tt.rung}, testMessages).result(t)
			var got []string
			for _, tool := range decodeRequest(t, e.model.Requests()[0]).Tools {
				got = append(got, tool.Function.Name)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("tools offered %v, want %v", got, tt.want)
			}
		})
	}
}

func TestToolCallLimit(t *testing.T) {
	ns := natstest.Start(t)
	tool := startUserTool(t, ns.NC)
	call := func(n int) openaitest.Reply {
		return toolCalls(n, [2]string{"create_user", `{"name":"U","email":"u` + string(rune('0'+n)) + `@x"}`})
	}
	e := newEnv(t, sequence(call(1), call(2), call(3)),
		policy.Type{Tools: []policy.Tool{createUser}, MaxToolCalls: 2}, func(c *executor.Config) { c.NATS = ns.NC })
	r := e.handle("t1", 1, testMessages).result(t)
	if r.ErrorClass != events.ErrorClassInvalidOutput || !strings.Contains(r.Error, "after the limit of 2 tool calls") {
		t.Errorf("result %+v, want an invalid output: the model kept calling tools", r)
	}
	if n := len(tool.requests()); n != 2 {
		t.Errorf("the tool got %d calls, want the limit, 2", n)
	}
	reqs := e.model.Requests()
	if len(reqs) != 3 || decodeRequest(t, reqs[2]).ToolChoice != "none" {
		t.Errorf("%d model calls, want 3, the last with tool_choice none", len(reqs))
	}
}

// A tool the policy does not offer is counted under tool="unknown": the
// name the model made up never becomes a label.
func TestUnofferedToolIsCountedAsUnknown(t *testing.T) {
	ns := natstest.Start(t)
	startUserTool(t, ns.NC)
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"drop_all_tables", `{}`}, [2]string{"create_user", `{"name":"Ann","email":"ann@example.com"}`}),
		ok("created the user"),
	), policy.Type{Tools: []policy.Tool{createUser}}, func(c *executor.Config) { c.NATS = ns.NC })
	if r := e.handle("t1", 1, testMessages).result(t); r.Outcome != events.OutcomeSuccess || r.ToolCalls != 2 {
		t.Fatalf("result %+v, want a success after 2 tool calls", r)
	}
	for tool, want := range map[string]float64{"unknown": 1, "create_user": 1, "drop_all_tables": 0} {
		if got := e.counter("dispatch_executor_tool_calls_total", map[string]string{"tool": tool}); got != want {
			t.Errorf("dispatch_executor_tool_calls_total{tool=%q} = %v, want %v", tool, got, want)
		}
	}
}
