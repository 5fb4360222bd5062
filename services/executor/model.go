package executor

import (
	"context"

	"dispatchmesh/events"
)

// Model answers one prompt. Implementations must honour ctx and return its
// error when it is cancelled.
type Model interface {
	Complete(ctx context.Context, req Request) (Response, error)
}

// Request is one call to a model.
type Request struct {
	// Model is the model name to ask for.
	Model string
	// Messages are the prompt, sent verbatim.
	Messages []events.Message
	// TaskType, TaskID and Attempt say what the call is for (logs, the
	// simulated model's decision).
	TaskType, TaskID string
	Attempt          int
}

// Response is a model's answer.
type Response struct {
	// Content is the answer's text, expected to hold the structured result.
	Content string
	// Model is the model that answered, as the provider names it (it may be a
	// dated variant of the requested name); "" means the requested one.
	Model string
	// TokensIn and TokensOut are the prompt and completion tokens used.
	TokensIn, TokensOut int
	// Simulated is true for answers of the built-in simulated model.
	Simulated bool
}
