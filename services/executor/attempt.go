package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// attempt is one execution of a prompted task: the request, the endpoint it
// goes to, and what is known of the task's failed requests.
type attempt struct {
	s    *Service
	in   events.Prompted
	base events.Base
	pol  policy.Type
	f    facts
	// known is the task's state as the attempt last read or wrote it.
	known *known
	// model names what runs the attempt in its Result (the model, or
	// "command:<program>").
	model string
	// endpoint is where the attempt's last call went (the transient
	// metric); an agent command's name.
	endpoint string
	// routes are the models the attempt may call, in order; route is the
	// one called last, passed the names of those the last call passed
	// over before it (Result.Fallbacks).
	routes []route
	route  *route
	passed []string
	// failedNow holds the hashes of requests this try banned on models it
	// then passed over; bannedRoutes the same as Result.Banned entries.
	failedNow    map[string]bool
	bannedRoutes []string
	// banned maps a failed tool call's hash to its error, when known.
	banned map[string]string
	// prompt is how many of a model request's messages are the prompt's;
	// the tool loop's turns follow them.
	prompt int
	// tried is what this try's model calls spent (set by conclude).
	tried events.Usage
}

// outcome is how the calls of an attempt ended.
type outcome struct {
	// final is the answer, when err is nil.
	final Response
	// hash is the hash of the last request sent to the model (or command).
	hash                string
	tokensIn, tokensOut int
	cost                float64
	// model is the model that answered ("" when none did).
	model                   string
	toolCalls, toolRefusals int
	// err is the error the attempt stopped on; endpoint is where it
	// happened.
	err      error
	endpoint string
	// tool is the tool whose call failed transiently (err), when one did.
	tool *policy.Tool
	// turns are the tool loop's messages after the prompt's, and pending
	// the calls of the last answer not answered yet: what a cut-short try
	// leaves to resume.
	turns   []Message
	pending []ToolCall
}

// add counts one model answer.
func (o *outcome) add(s *Service, a *attempt, resp Response) {
	cost := s.cost(a.model, resp)
	o.tokensIn += resp.TokensIn
	o.tokensOut += resp.TokensOut
	o.cost += cost
	if resp.Model != "" {
		o.model = resp.Model
	}
	model := resp.Model
	if model == "" {
		model = a.model
	}
	s.metrics.usage(model, a.in.Task.Type, resp.TokensIn, resp.TokensOut, cost)
	if a.route != nil {
		s.metrics.routeUsage(a.route.name, resp.TokensIn, resp.TokensOut, cost)
	}
	s.metrics.promptTokens(a.in.Task.Type, a.in.Run.Rung, resp.TokensIn)
}

// converse runs the conversation: one model call, or a bounded tool loop
// when tools are offered; each call goes to the first model of the
// attempt's routes that takes it (complete). A loop that a try before this
// one cut short (facts.resume, whose turns req already holds) answers its
// pending tool calls first, without a model call.
func (a *attempt) converse(ctx context.Context, req Request, tools []policy.Tool) (o outcome) {
	s := a.s
	defer func() { o.turns = req.Messages[a.prompt:] }()
	byName := map[string]policy.Tool{}
	for _, t := range tools {
		byName[t.Name] = t
	}
	limit := a.pol.MaxToolCalls
	if limit <= 0 {
		limit = DefaultMaxToolCalls
	}
	if r := a.f.resume; r != nil {
		o.pending, o.toolCalls, o.toolRefusals = callsOf(r.Pending), r.ToolCalls, r.ToolRefusals
	}
	for {
		for len(o.pending) > 0 {
			tc := o.pending[0]
			content, refused := limitMessage(limit), false
			if o.toolCalls < limit {
				var err error
				content, refused, err = a.runTool(ctx, byName, tc)
				if err != nil {
					t := byName[tc.Name]
					o.err, o.endpoint, o.tool = err, "tool:"+t.Subject, &t
					return o
				}
			}
			o.toolCalls++
			if refused {
				o.toolRefusals++
			}
			s.metrics.toolCalls.WithLabelValues(toolLabel(byName, tc.Name)).Inc()
			req.Messages = append(req.Messages, Message{Role: RoleTool, ToolCallID: tc.ID, Content: content})
			o.pending = o.pending[1:]
		}
		if o.toolCalls >= limit && len(req.Tools) > 0 {
			req.ToolChoice = ToolChoiceNone
		}
		resp, hash, err := a.complete(ctx, req)
		o.hash = hash
		if err != nil && ctx.Err() != nil {
			o.err = ctx.Err()
			return o
		}
		if err != nil {
			o.err, o.endpoint = err, a.endpoint
			return o
		}
		o.add(s, a, resp)
		if len(resp.ToolCalls) == 0 || len(req.Tools) == 0 {
			o.final = resp
			return o
		}
		if req.ToolChoice == ToolChoiceNone {
			o.final = resp
			o.err = &InvalidOutputError{
				Reason: fmt.Sprintf("the model kept calling tools after the limit of %d tool calls", limit),
				Answer: resp.Content,
			}
			return o
		}
		req.Messages = append(slices.Clone(req.Messages),
			Message{Role: RoleAssistant, Content: resp.Content, ToolCalls: resp.ToolCalls})
		o.pending = resp.ToolCalls
	}
}

// runTool runs one tool call and returns the tool message content. A call
// identical to one that failed deterministically is refused (refused true)
// without being sent. A deterministic tool error is recorded and becomes the
// content; a transient one (or ctx's end) is returned as err.
func (a *attempt) runTool(ctx context.Context, byName map[string]policy.Tool, tc ToolCall) (content string, refused bool, err error) {
	s := a.s
	if strings.TrimSpace(tc.Arguments) == "" {
		tc.Arguments = "{}" // a call without arguments
	}
	hash := ToolCallHash(tc.Name, tc.Arguments)
	if lastErr, ok := a.banned[hash]; ok || a.f.failed[hash] {
		s.metrics.toolRefusals.WithLabelValues(toolLabel(byName, tc.Name)).Inc()
		s.cfg.Log.Warn("tool call refused: identical to a failed call",
			"task", a.in.Task.ID, "tool", tc.Name, "hash", HashPrefix(hash))
		return refusalMessage(tc.Name, hash, lastErr), true, nil
	}
	t, known := byName[tc.Name]
	var reply []byte
	switch {
	case !known:
		names := make([]string, 0, len(byName))
		for n := range byName {
			names = append(names, n)
		}
		err = &ToolError{Tool: tc.Name, Code: 404, Description: fmt.Sprintf("unknown tool %q; the tools are %q", tc.Name, names)}
	case !jsonObject(tc.Arguments):
		err = &ToolError{Tool: tc.Name, Subject: t.Subject, Code: 400, Description: "the arguments are not a JSON object", Body: []byte(tc.Arguments)}
	default:
		reply, err = callTool(ctx, s.cfg.NATS, t, tc.Name, tc.Arguments)
	}
	if err == nil {
		return string(reply), false, nil
	}
	if ctx.Err() != nil {
		return "", false, ctx.Err()
	}
	c := Classify(err, s.rules)
	var te *ToolError
	if c.Class == events.ErrorClassTransient || !errors.As(err, &te) {
		return "", false, err
	}
	content = toolErrorMessage(te, c.Class)
	if err := s.ledger.addFailed(ctx, a.base, a.known, hash, events.ErrorClassDeterministic, ""); err != nil {
		return "", false, err
	}
	a.banned[hash] = content
	s.cfg.Log.Info("tool call failed", "task", a.in.Task.ID, "tool", tc.Name, "code", te.Code, "class", c.Class)
	return content, false, nil
}
