package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// Tool loop defaults.
const (
	// DefaultMaxToolCalls bounds the tool calls of one attempt when the
	// policy's max_tool_calls is not set.
	DefaultMaxToolCalls = 8
	// DefaultToolTimeout bounds one tool call when the tool sets no timeout.
	DefaultToolTimeout = 30 * time.Second
	// DefaultToolWait bounds how long an attempt waits for a tool that does
	// not answer when the policy's tool_wait is not set.
	DefaultToolWait = 10 * time.Minute
	// DefaultToolBackoffMax caps the snoozes of that wait (Config.ToolBackoff).
	DefaultToolBackoffMax = time.Minute
)

// toolsFor are the tools offered to an attempt: the type's tools, plus its
// research tools on the RESEARCH rung. A later tool of the same name wins.
func toolsFor(pol policy.Type, run events.Run) []policy.Tool {
	tools := append([]policy.Tool(nil), pol.Tools...)
	if run.Rung == events.RungResearch {
		tools = append(tools, pol.ResearchTools...)
	}
	var out []policy.Tool
	seen := map[string]int{}
	for _, t := range tools {
		if i, ok := seen[t.Name]; ok {
			out[i] = t
			continue
		}
		seen[t.Name] = len(out)
		out = append(out, t)
	}
	return out
}

func toolSpecs(tools []policy.Tool) []ToolSpec {
	var specs []ToolSpec
	for _, t := range tools {
		specs = append(specs, ToolSpec{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
	}
	return specs
}

// requestTool sends one tool call on the tool's subject. A reply with the
// micro error headers is a *ToolError; no responders and timeouts come back
// as the NATS/context errors (transient for Classify).
func requestTool(ctx context.Context, nc *nats.Conn, t policy.Tool, args string) ([]byte, error) {
	timeout := time.Duration(t.Timeout)
	if timeout <= 0 {
		timeout = DefaultToolTimeout
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg := nats.NewMsg(t.Subject)
	msg.Data = []byte(args)
	reply, err := nc.RequestMsgWithContext(tctx, msg)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("tool %s (%s): %w", t.Name, t.Subject, err)
	}
	code, desc := reply.Header.Get(micro.ErrorCodeHeader), reply.Header.Get(micro.ErrorHeader)
	if code == "" && desc == "" {
		return reply.Data, nil
	}
	te := &ToolError{Tool: t.Name, Subject: t.Subject, Description: desc, Body: reply.Data}
	if n, err := strconv.Atoi(strings.TrimSpace(code)); err == nil {
		te.Code = n
	} else {
		// a code that is not a number says the request was wrong in its own words
		te.Code = 400
		te.Description = strings.TrimSpace(code + " " + desc)
	}
	return nil, te
}

// toolErrorMessage is the tool message telling the model a call failed:
// everything the tool said (code, description, the reply body as JSON when it
// is JSON) and what to do about it.
func toolErrorMessage(te *ToolError, class events.ErrorClass) string {
	var body any
	if len(te.Body) > 0 {
		if json.Valid(te.Body) {
			body = json.RawMessage(te.Body)
		} else {
			body = string(te.Body)
		}
	}
	msg := struct {
		Error struct {
			Tool        string            `json:"tool"`
			Code        int               `json:"code"`
			Description string            `json:"description,omitempty"`
			Class       events.ErrorClass `json:"class"`
			Body        any               `json:"body,omitempty"`
		} `json:"error"`
		Instruction string `json:"instruction"`
	}{Instruction: "This call failed deterministically: sending the same arguments again will be refused. " +
		"Read the error, then call again only with arguments that fix what it names."}
	msg.Error.Tool, msg.Error.Code, msg.Error.Description, msg.Error.Class, msg.Error.Body = te.Tool, te.Code, te.Description, class, body
	b, err := json.Marshal(msg)
	if err != nil {
		return te.Error()
	}
	return string(b)
}

// refusalMessage is the tool message answering a call that repeats a failed
// one: it was not sent.
func refusalMessage(name, hash, lastError string) string {
	msg := struct {
		Refused     bool   `json:"refused"`
		Tool        string `json:"tool"`
		Reason      string `json:"reason"`
		LastError   any    `json:"last_error,omitempty"`
		Instruction string `json:"instruction"`
	}{
		Refused: true, Tool: name,
		Reason: fmt.Sprintf("this call (%s) is identical to a call that already failed deterministically in this task; it was not sent", HashPrefix(hash)),
		Instruction: "The arguments must change: fix what the error named. " +
			"Say which argument you change and why, then call the tool with the changed arguments.",
	}
	switch {
	case lastError == "":
		msg.LastError = "it failed in an earlier attempt of this task; the error was reported then"
	case json.Valid([]byte(lastError)):
		msg.LastError = json.RawMessage(lastError)
	default:
		msg.LastError = lastError
	}
	b, _ := json.Marshal(msg)
	return string(b)
}

// limitMessage answers a tool call past the attempt's budget.
func limitMessage(limit int) string {
	return fmt.Sprintf(`{"not_run":true,"reason":"the limit of %d tool calls for this attempt is reached","instruction":"answer now with the structured result"}`, limit)
}

// jsonObject reports whether s is one JSON object.
func jsonObject(s string) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal([]byte(s), &m) == nil && m != nil
}
