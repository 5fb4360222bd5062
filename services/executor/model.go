package executor

import (
	"context"
	"encoding/json"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Model answers one prompt. Implementations must honour ctx and return its
// error when it is cancelled. A model that supports tools answers a request
// offering Tools either with content or with ToolCalls; the executor runs the
// calls and asks again with the results appended to Messages.
type Model interface {
	Complete(ctx context.Context, req Request) (Response, error)
}

// Endpointer is implemented by models that call a remote endpoint. The
// executor keeps one circuit breaker per model at its endpoint; a model
// without it is named by its Go type.
type Endpointer interface {
	Endpoint() string
}

// Message roles.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one message of a conversation with a model: the prompt's
// messages, then, in a tool loop, the assistant's tool calls and the tool
// results.
type Message struct {
	Role    string
	Content string
	// ToolCalls are the calls an assistant message asked for.
	ToolCalls []ToolCall
	// ToolCallID names the call a tool message answers.
	ToolCallID string
}

// PromptMessages converts a prompt's messages.
func PromptMessages(ms []events.Message) []Message {
	out := make([]Message, len(ms))
	for i, m := range ms {
		out[i] = Message{Role: m.Role, Content: m.Content}
	}
	return out
}

// ToolCall is one function call the model asked for.
type ToolCall struct {
	// ID is the provider's id of the call; the tool message answering it
	// carries it back.
	ID   string
	Name string
	// Arguments is the JSON object of arguments, as the model wrote it.
	Arguments string
}

// ToolSpec is a function offered to the model.
type ToolSpec struct {
	Name        string
	Description string
	// Parameters is the JSON Schema of the arguments (nil: no arguments).
	Parameters json.RawMessage
}

// ResponseFormatJSON asks for a JSON object answer (Request.ResponseFormat).
const ResponseFormatJSON = "json_object"

// ToolChoiceNone asks the model to answer without calling a tool
// (Request.ToolChoice), once the tool-call budget is spent.
const ToolChoiceNone = "none"

// Request is one call to a model. Everything but TaskType, TaskID and
// Attempt is part of RequestHash.
type Request struct {
	// Model is the model name to ask for.
	Model string
	// Endpoint names the endpoint and key of a policy chain's model that
	// has its own (base URL "#" credential name), "" for the executor's:
	// the same messages to another endpoint or key are another request.
	Endpoint string
	// Messages are the conversation, sent verbatim.
	Messages []Message
	// ResponseFormat is ResponseFormatJSON or "" (the provider's default).
	ResponseFormat string
	// Tools are the functions the model may call; nil offers none.
	Tools []ToolSpec
	// ToolChoice is "" (the model decides) or ToolChoiceNone.
	ToolChoice string
	// TaskType, TaskID and Attempt say what the call is for (logs, the
	// simulated model's decision).
	TaskType, TaskID string
	Attempt          int
}

// Response is a model's answer.
type Response struct {
	// Content is the answer's text, expected to hold the structured result.
	Content string
	// ToolCalls are the tool calls the model asked for instead of answering.
	ToolCalls []ToolCall
	// Model is the model that answered, as the provider names it (it may be a
	// dated variant of the requested name); "" means the requested one.
	Model string
	// TokensIn and TokensOut are the prompt and completion tokens used.
	TokensIn, TokensOut int
	// Simulated is true for answers of the built-in simulated model.
	Simulated bool
}
