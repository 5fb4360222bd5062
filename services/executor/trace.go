package executor

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Span names and attributes of the executor's calls, children of the
// executor's stage span when the message is traced.
const (
	SpanModel   = "model.call"
	SpanTool    = "tool.call"
	SpanCommand = "command.run"

	AttrModel         = "gen_ai.request.model"
	AttrResponseModel = "gen_ai.response.model"
	AttrTokensIn      = "gen_ai.usage.input_tokens"
	AttrTokensOut     = "gen_ai.usage.output_tokens"
	AttrToolName      = "dispatch.tool.name"
	AttrToolSubject   = "dispatch.tool.subject"
	AttrToolCalls     = "dispatch.tool_calls" // the tool calls a model answer asked for
)

// complete is one call to model m, in a span of its own when traced.
func complete(ctx context.Context, m Model, req Request) (Response, error) {
	ctx, span := tracing.Child(ctx, SpanModel, trace.SpanKindClient)
	resp, err := m.Complete(ctx, req)
	if span.IsRecording() {
		span.SetAttributes(attribute.String(AttrModel, req.Model), attribute.String(AttrResponseModel, resp.Model),
			attribute.Int(AttrTokensIn, resp.TokensIn), attribute.Int(AttrTokensOut, resp.TokensOut),
			attribute.Int(AttrToolCalls, len(resp.ToolCalls)),
			attribute.String(services.AttrTaskID, req.TaskID), attribute.Int(services.AttrAttempt, req.Attempt))
	}
	tracing.End(span, err)
	return resp, err
}

// callTool is one tool call over NATS, in a span of its own when traced.
func callTool(ctx context.Context, nc *nats.Conn, t policy.Tool, name, args string) ([]byte, error) {
	ctx, span := tracing.Child(ctx, SpanTool, trace.SpanKindClient)
	reply, err := requestTool(ctx, nc, t, args)
	if span.IsRecording() {
		span.SetAttributes(attribute.String(AttrToolName, name), attribute.String(AttrToolSubject, t.Subject))
	}
	tracing.End(span, err)
	return reply, err
}

// traced runs a command (an agent's, a pipeline step's) in a span of its
// own when traced. A failed attempt is the span's error.
func traced(ctx context.Context, run func(context.Context) (events.Result, error)) (events.Result, error) {
	ctx, span := tracing.Child(ctx, SpanCommand, trace.SpanKindInternal)
	r, err := run(ctx)
	if span.IsRecording() {
		span.SetAttributes(attribute.String(services.AttrOutcome, r.Outcome))
		if err == nil && r.Error != "" {
			span.AddEvent("failed", trace.WithAttributes(attribute.String("dispatch.error", r.Error)))
		}
	}
	tracing.End(span, err)
	return r, err
}
