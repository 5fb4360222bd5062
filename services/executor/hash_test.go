package executor_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

func TestRequestHash(t *testing.T) {
	base := executor.Request{
		Model:          "gpt-4o",
		Messages:       executor.PromptMessages(testMessages),
		ResponseFormat: executor.ResponseFormatJSON,
		TaskType:       "css_fix", TaskID: "t1", Attempt: 1,
	}
	with := func(change func(r *executor.Request)) executor.Request {
		r := base
		r.Messages = append([]executor.Message(nil), base.Messages...)
		change(&r)
		return r
	}
	same := map[string]executor.Request{
		"other task, attempt": with(func(r *executor.Request) { r.TaskID, r.Attempt, r.TaskType = "t2", 5, "x" }),
		"CRLF": with(func(r *executor.Request) {
			r.Messages[1].Content = strings.ReplaceAll(r.Messages[1].Content, "\n", "\r\n")
		}),
		"trailing space": with(func(r *executor.Request) { r.Messages[0].Content += " \t\n\n" }),
		"line-end space": with(func(r *executor.Request) {
			r.Messages[1].Content = strings.ReplaceAll(r.Messages[1].Content, "\n", "  \n")
		}),
	}
	different := map[string]executor.Request{
		"model":         with(func(r *executor.Request) { r.Model = "gpt-4o-mini" }),
		"content":       with(func(r *executor.Request) { r.Messages[1].Content += " please" }),
		"leading space": with(func(r *executor.Request) { r.Messages[1].Content = " " + r.Messages[1].Content }),
		"role":          with(func(r *executor.Request) { r.Messages[0].Role = "user" }),
		"message order": with(func(r *executor.Request) { r.Messages[0], r.Messages[1] = r.Messages[1], r.Messages[0] }),
		"one more": with(func(r *executor.Request) {
			r.Messages = append(r.Messages, executor.Message{Role: "user", Content: "x"})
		}),
		"response format": with(func(r *executor.Request) { r.ResponseFormat = "" }),
		"tools": with(func(r *executor.Request) {
			r.Tools = []executor.ToolSpec{{Name: "search", Parameters: json.RawMessage(`{"type":"object"}`)}}
		}),
		"tool choice": with(func(r *executor.Request) { r.ToolChoice = executor.ToolChoiceNone }),
	}
	h := executor.RequestHash(base)
	if len(h) != 64 {
		t.Fatalf("hash %q, want 64 hex digits", h)
	}
	for name, r := range same {
		if got := executor.RequestHash(r); got != h {
			t.Errorf("%s: hash changed", name)
		}
	}
	for name, r := range different {
		if got := executor.RequestHash(r); got == h {
			t.Errorf("%s: hash unchanged", name)
		}
	}

	// tools: schema key order and call ids do not matter, arguments do
	tools := func(schema string) executor.Request {
		return with(func(r *executor.Request) {
			r.Tools = []executor.ToolSpec{{Name: "search", Parameters: json.RawMessage(schema)}}
		})
	}
	if executor.RequestHash(tools(`{"type":"object","required":["q"]}`)) != executor.RequestHash(tools(`{ "required":["q"], "type":"object" }`)) {
		t.Error("tool schema key order changes the hash")
	}
	loop := func(id, args string) executor.Request {
		return with(func(r *executor.Request) {
			r.Messages = append(r.Messages,
				executor.Message{Role: executor.RoleAssistant, ToolCalls: []executor.ToolCall{{ID: id, Name: "search", Arguments: args}}},
				executor.Message{Role: executor.RoleTool, ToolCallID: id, Content: "no hits"})
		})
	}
	if executor.RequestHash(loop("call_1", `{"q":"a","n":1}`)) != executor.RequestHash(loop("call_9", `{"n":1, "q":"a"}`)) {
		t.Error("call ids or argument key order change the hash")
	}
	if executor.RequestHash(loop("call_1", `{"q":"a"}`)) == executor.RequestHash(loop("call_1", `{"q":"b"}`)) {
		t.Error("changed arguments keep the hash")
	}
}

func TestToolCallHash(t *testing.T) {
	h := executor.ToolCallHash("create_user", `{"name":"Ann","tags":["a","b"],"age":30}`)
	if !strings.HasPrefix(h, executor.ToolHashPrefix) {
		t.Fatalf("hash %q lacks the %q prefix", h, executor.ToolHashPrefix)
	}
	for _, args := range []string{
		`{"age":30,"tags":["a","b"],"name":"Ann"}`,
		"{\n  \"tags\": [\"a\", \"b\"],\n  \"name\": \"Ann\",\n  \"age\": 30\n}\n",
	} {
		if got := executor.ToolCallHash("create_user", args); got != h {
			t.Errorf("%s: hash differs, want the same call", args)
		}
	}
	for name, c := range map[string][2]string{
		"other tool":  {"delete_user", `{"name":"Ann","tags":["a","b"],"age":30}`},
		"value":       {"create_user", `{"name":"Ann","tags":["a","b"],"age":31}`},
		"array order": {"create_user", `{"name":"Ann","tags":["b","a"],"age":30}`},
		"extra key":   {"create_user", `{"name":"Ann","tags":["a","b"],"age":30,"email":"a@b"}`},
		"number form": {"create_user", `{"name":"Ann","tags":["a","b"],"age":30.0}`},
	} {
		if executor.ToolCallHash(c[0], c[1]) == h {
			t.Errorf("%s: same hash, want a different call", name)
		}
	}
	if executor.ToolCallHash("t", "not json ") != executor.ToolCallHash("t", " not json") {
		t.Error("non-JSON arguments are not compared trimmed")
	}
	if executor.ToolCallHash("t", `{"a":1} x`) == executor.ToolCallHash("t", `{"a":1}`) {
		t.Error("trailing text after the JSON value is ignored")
	}
}

func FuzzToolCallHash(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[1,2]}`, `{"b":[1,2],"a":1}`, "", "null", `"x"`, `{"a":1} {}`, "\xff", `{"a":1e400}`, `[{"z":0,"a":{}}]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, args string) {
		h := executor.ToolCallHash("tool", args)
		if h != executor.ToolCallHash("tool", args) || !strings.HasPrefix(h, executor.ToolHashPrefix) {
			t.Fatal("hash not deterministic")
		}
		// a JSON object re-indented is the same call
		var v map[string]any
		if json.Unmarshal([]byte(args), &v) == nil && v != nil {
			var buf strings.Builder
			enc := json.NewEncoder(&buf)
			enc.SetIndent("", "  ")
			enc.SetEscapeHTML(false)
			if err := enc.Encode(v); err == nil {
				re := executor.ToolCallHash("tool", buf.String())
				if !strings.ContainsAny(args, ".eE") && re != h { // float re-encoding may change the digits
					t.Fatalf("re-indented %q → %q hashes differently", args, buf.String())
				}
			}
		}
	})
}
