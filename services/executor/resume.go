package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

const (
	// keepTimeout bounds the write that keeps a tool loop cut short by shutdown.
	keepTimeout = 5 * time.Second
	// toolWaitSnoozes sizes the snoozes of a long tool wait: their cap is at
	// least the wait / toolWaitSnoozes.
	toolWaitSnoozes = 20
)

// usage is what the try's model calls spent.
func (o outcome) usage() events.Usage {
	return events.Usage{TokensIn: o.tokensIn, TokensOut: o.tokensOut, Cost: o.cost}
}

// resumeOf is the tool loop a cut-short try leaves to resume: nil when it
// has no turns (no model answer to keep). The tool wait's start and count
// carry over from the try before.
func (a *attempt) resumeOf(o outcome) *events.Resume {
	if len(o.turns) == 0 {
		return nil
	}
	r := &events.Resume{Pass: a.base.Run.Pass, Turns: turnsOf(o.turns), Pending: eventCalls(o.pending),
		ToolCalls: o.toolCalls, ToolRefusals: o.toolRefusals}
	if p := a.f.resume; p != nil {
		r.ToolWaitSince, r.ToolWaits = p.ToolWaitSince, p.ToolWaits
	}
	return r
}

// toolWait snoozes an attempt whose tool did not answer (no responders, a
// timeout, a tool's 5xx) — no model call, not an attempt, not counted
// against the transient budget — keeping its tool loop so the redelivery
// asks the tool again and goes on from there. The wait runs from the first
// time a tool of the attempt did not answer; past the type's tool wait the
// attempt fails with ErrorClassToolUnavailable, for a human.
func (s *Service) toolWait(ctx context.Context, a *attempt, r events.Result, c Classification, o outcome) (events.Result, error) {
	s.metrics.transient.WithLabelValues(o.endpoint).Inc()
	bound := time.Duration(a.pol.ToolWait)
	if bound <= 0 {
		bound = DefaultToolWait
	}
	now := s.cfg.Now()
	resume := a.resumeOf(o)
	if resume == nil { // cannot happen: a tool call follows a model's turn
		resume = &events.Resume{Pass: a.base.Run.Pass}
	}
	if resume.ToolWaitSince.IsZero() {
		resume.ToolWaitSince = now
	}
	waited := now.Sub(resume.ToolWaitSince)
	if waited >= bound {
		if err := s.ledger.settle(ctx, a.base, a.known); err != nil {
			return events.Result{}, err
		}
		s.metrics.errors.WithLabelValues(s.metrics.typ(a.in.Task.Type), string(events.ErrorClassToolUnavailable)).Inc()
		r.Outcome, r.ErrorClass = events.OutcomeFailure, events.ErrorClassToolUnavailable
		r.Error = fmt.Sprintf("tool unavailable: %s (subject %s) has not answered for %s (%s) — start the service that answers %s, "+
			"or fix the tool's subject in the type's policy; last error: %v",
			o.tool.Name, o.tool.Subject, waited.Round(time.Second), c.Reason, o.tool.Subject, o.err)
		return r, nil
	}
	resume.ToolWaits++
	// A long wait gets longer snoozes: past the ramp, at most
	// 2 × toolWaitSnoozes of them, so MaxDeliver never ends a wait first.
	// Never past the bound: the last try asks the tool at the bound itself.
	backoff := s.cfg.ToolBackoff
	backoff.Max = max(backoff.Max, bound/toolWaitSnoozes)
	delay := min(backoff.HalfJitter(resume.ToolWaits, s.cfg.Rand()), bound-waited)
	if _, err := s.ledger.cutShort(ctx, a.base, a.known, o.usage(), resume, false); err != nil {
		return events.Result{}, err
	}
	s.metrics.snooze.WithLabelValues(snoozeToolWait).Observe(delay.Seconds())
	s.cfg.Log.Warn("tool did not answer: snoozed, the tool loop is kept",
		"task", a.in.Task.ID, "type", a.in.Task.Type, "pass", a.in.Run.Pass, "tool", o.tool.Name, "subject", o.tool.Subject,
		"waits", resume.ToolWaits, "waited", waited, "tool_wait", bound, "delay", delay, "reason", c.Reason, "err", o.err,
		"turns", len(resume.Turns), "pending", len(resume.Pending))
	return events.Result{}, services.Snooze(delay, o.err)
}

// keep saves the tool loop of a try that shutdown cut short, and what its
// model calls spent, so the redelivery resumes instead of paying for the
// same turns again. It writes past ctx's end, briefly; a failure to write
// only costs those turns again.
func (s *Service) keep(ctx context.Context, a *attempt, o outcome) {
	resume := a.resumeOf(o)
	if resume == nil {
		return
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keepTimeout)
	defer cancel()
	if _, err := s.ledger.cutShort(kctx, a.base, a.known, o.usage(), resume, false); err != nil {
		s.cfg.Log.Warn("tool loop cut short by shutdown not kept", "task", a.in.Task.ID, "err", err)
	}
}

// turnsOf and messagesOf convert a tool loop's messages to and from the
// task state's form.
func turnsOf(ms []Message) []events.Turn {
	out := make([]events.Turn, len(ms))
	for i, m := range ms {
		out[i] = events.Turn{Role: m.Role, Content: m.Content, ToolCalls: eventCalls(m.ToolCalls), ToolCallID: m.ToolCallID}
	}
	return out
}

func messagesOf(ts []events.Turn) []Message {
	out := make([]Message, len(ts))
	for i, t := range ts {
		out[i] = Message{Role: t.Role, Content: t.Content, ToolCalls: callsOf(t.ToolCalls), ToolCallID: t.ToolCallID}
	}
	return out
}

func eventCalls(tcs []ToolCall) []events.ToolCall {
	if len(tcs) == 0 {
		return nil
	}
	out := make([]events.ToolCall, len(tcs))
	for i, tc := range tcs {
		out[i] = events.ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments}
	}
	return out
}

func callsOf(tcs []events.ToolCall) []ToolCall {
	if len(tcs) == 0 {
		return nil
	}
	out := make([]ToolCall, len(tcs))
	for i, tc := range tcs {
		out[i] = ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments}
	}
	return out
}
