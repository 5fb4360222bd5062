package services

import (
	"context"
	"unicode/utf8"

	json "github.com/go-json-experiment/json/v1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
)

// Span attributes of a stage's span (one per message a service handles).
const (
	AttrTaskID    = "dispatch.task.id"
	AttrTaskType  = "dispatch.task.type"
	AttrPass      = "dispatch.pass"
	AttrAttempt   = "dispatch.attempt"
	AttrRung      = "dispatch.rung"
	AttrStep      = "dispatch.step"
	AttrDelivery  = "dispatch.delivery"   // the message's delivery, 1 on the first
	AttrFate      = "dispatch.fate"       // ack, nak or term
	AttrResult    = "dispatch.result"     // ok, snoozed, retried, dead, shutdown
	AttrNext      = "dispatch.next"       // the stage (or review.<reason>) the task moves to
	AttrCause     = "dispatch.cause"      // the gate's decision cause (Cause*)
	AttrHold      = "dispatch.hold"       // why the gate holds the pass (Hold*)
	AttrReason    = "dispatch.reason"     // why: a retry's, a hold's, a review record's (first 256 bytes)
	AttrNextRung  = "dispatch.next.rung"  // the rung of the pass the task moves to
	AttrOutcome   = "dispatch.outcome"    // an executed attempt's outcome
	AttrTokensIn  = "dispatch.tokens_in"  // an attempt's prompt tokens
	AttrTokensOut = "dispatch.tokens_out" // an attempt's completion tokens
	AttrSubject   = "messaging.destination.name"
)

// Tracing starts one span per message under the trace context its
// headers carry (traceparent: the submitter's, or the stage's that
// published it), named after the service, and ends it with the message's
// fate: the task's id, type, pass, attempt and rung from the message, the
// next stage, decision cause and tokens from the output that moves the
// task on. A failure (retried, dead) is recorded as the span's error. The
// router publishes the outputs under the span's context, so the next
// stage's span is its child. A nil tracer (tracing off) adds nothing.
func Tracing(tracer trace.Tracer, service string) Middleware {
	if tracer == nil {
		return func(next Handler) Handler { return next }
	}
	return func(next Handler) Handler {
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			ctx = tracing.Extract(ctx, m.Header)
			ctx, span := tracer.Start(ctx, service, trace.WithSpanKind(trace.SpanKindConsumer))
			outs, err := next(ctx, m)
			if span.IsRecording() {
				spanIn(span, m)
				spanOut(span, outs)
				spanFate(span, err)
			}
			span.End()
			return outs, err
		}
	}
}

// spanIn sets what the consumed message says of its task.
func spanIn(span trace.Span, m *Msg) {
	id, pass := TaskOf(m)
	var in struct {
		Type string `json:"type"` // a submission's
		Task struct {
			Type string `json:"type"`
		} `json:"task"`
		Run struct {
			Attempt int    `json:"attempt"`
			Rung    string `json:"rung"`
			Step    string `json:"step"`
		} `json:"run"`
	}
	_ = json.Unmarshal(m.Data, &in) // what does not decode is left out
	typ := in.Task.Type
	if typ == "" {
		typ = in.Type
	}
	span.SetAttributes(attribute.String(AttrSubject, m.Subject), attribute.Int(AttrDelivery, m.Delivered),
		attribute.String(AttrTaskID, id), attribute.Int(AttrPass, pass), attribute.String(AttrTaskType, typ))
	if in.Run.Attempt > 0 {
		span.SetAttributes(attribute.Int(AttrAttempt, in.Run.Attempt))
	}
	if in.Run.Rung != "" {
		span.SetAttributes(attribute.String(AttrRung, in.Run.Rung))
	}
	if in.Run.Step != "" {
		span.SetAttributes(attribute.String(AttrStep, in.Run.Step))
	}
}

// spanOut sets what the output that moves the task on (the last) says:
// where the task goes, why, and what an attempt spent.
func spanOut(span trace.Span, outs []Out) {
	if len(outs) == 0 {
		return
	}
	last := outs[len(outs)-1]
	if _, stage, ok := events.ParseTaskSubject(last.Subject); ok {
		span.SetAttributes(attribute.String(AttrNext, stage))
	} else if reason, _, ok := events.ParseReviewSubject(last.Subject); ok {
		span.SetAttributes(attribute.String(AttrNext, "review."+reason))
	}
	var out struct {
		Cause  string `json:"cause"`
		Hold   string `json:"hold"`
		Reason string `json:"reason"`
		Run    struct {
			Rung string `json:"rung"`
		} `json:"run"`
		Trust struct {
			Cause string `json:"cause"`
		} `json:"trust"`
		Result *struct {
			Outcome   string `json:"outcome"`
			TokensIn  int    `json:"tokens_in"`
			TokensOut int    `json:"tokens_out"`
		} `json:"result"`
	}
	if json.Unmarshal(last.Data, &out) != nil {
		return
	}
	cause := out.Trust.Cause // the gate's decision
	if cause == "" {
		cause = out.Cause // a hand-off's
	}
	if cause != "" {
		span.SetAttributes(attribute.String(AttrCause, cause))
	}
	if out.Hold != "" {
		span.SetAttributes(attribute.String(AttrHold, out.Hold))
	}
	if out.Reason != "" {
		span.SetAttributes(attribute.String(AttrReason, clipText(out.Reason, maxReason)))
	}
	if out.Run.Rung != "" {
		span.SetAttributes(attribute.String(AttrNextRung, out.Run.Rung))
	}
	if r := out.Result; r != nil {
		span.SetAttributes(attribute.String(AttrOutcome, r.Outcome),
			attribute.Int(AttrTokensIn, r.TokensIn), attribute.Int(AttrTokensOut, r.TokensOut))
	}
}

// maxReason bounds the reason a span carries: a failure's text can be a
// model's whole answer.
const maxReason = 256

// clipText is s cut to at most n bytes, on a rune boundary.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// spanFate sets what the router does with the message; a failure is the
// span's error.
func spanFate(span trace.Span, err error) {
	f := FateOf(err)
	span.SetAttributes(attribute.String(AttrFate, string(f.Action)), attribute.String(AttrResult, string(f.Result)))
	if f.Err == nil {
		return
	}
	span.RecordError(f.Err)
	if f.Result != ResultSnoozed { // a snooze is a wait, not a failure
		span.SetStatus(codes.Error, f.Err.Error())
	}
}
