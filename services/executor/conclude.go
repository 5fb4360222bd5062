package executor

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// DefaultTransientBudget is how many transient failures an attempt rides
// out when the policy's transient_budget is not set.
const DefaultTransientBudget = 8

// errRefused stops a tool loop whose next request repeats a failed one.
var errRefused = errors.New("request identical to a failed one")

// conclude turns the outcome of an attempt's calls into its Result, or into
// a snooze for a transient failure within the budget.
func (s *Service) conclude(ctx context.Context, a *attempt, o outcome) (events.Result, error) {
	a.tried = o.usage()
	if o.err != nil && ctx.Err() != nil {
		s.keep(ctx, a, o)
		return events.Result{}, ctx.Err() // shutdown, not an attempt: nak and redeliver
	}
	// The answer is in (and paid for): what it leaves in the task's state is
	// written even if ctx ends now (shutdown), or the next delivery would
	// pay for it again.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keepTimeout)
	defer cancel()
	// The attempt's spend includes what earlier tries of it spent before a
	// transient failure cut them short.
	spent := a.f.unbilled.Add(o.usage())
	r := events.Result{
		Model: a.model, RequestHash: o.hash, TransientRetries: a.f.transient,
		TokensIn: spent.TokensIn, TokensOut: spent.TokensOut, Cost: spent.Cost,
		ToolCalls: o.toolCalls, ToolRefusals: o.toolRefusals,
	}
	if o.model != "" {
		r.Model = o.model
	}
	if o.final.Simulated {
		r.Simulated = true
	}
	if a.route != nil && a.route.chain {
		r.Route, r.Fallbacks = a.route.name, slices.Clone(a.passed)
	}
	r.Banned = a.bannedOnRoutes()
	var (
		lerr *ledgerError
		wait *circuitWait
		none *NoModelLeft
	)
	switch {
	case o.err == nil:
		s.parse(&r, o.final.Content)
	case errors.As(o.err, &lerr):
		return events.Result{}, lerr.err // redelivered: the ban is written first
	case errors.As(o.err, &wait):
		return s.cooling(ctx, a, o, wait.wait)
	case errors.Is(o.err, errRefused):
		ref, err := s.refuse(ctx, a, o.hash, spent)
		ref.ToolCalls, ref.ToolRefusals = r.ToolCalls, r.ToolRefusals
		return ref, err
	case errors.Is(o.err, ErrInvalidOutput):
		r.Outcome, r.ErrorClass, r.Error = events.OutcomeFailure, events.ErrorClassInvalidOutput, o.err.Error()
	case errors.As(o.err, &none):
		// every model of the chain is the deployment's fault: a human, with
		// each model's fix
		// (each request sent was banned as its model failed: none to ban)
		r.Outcome, r.ErrorClass, r.Error = events.OutcomeFailure, none.Class(), none.Error()
		if err := s.failed(ctx, a, &r, ""); err != nil {
			return events.Result{}, err
		}
	default:
		c := Classify(o.err, s.rules)
		switch {
		case c.Class == events.ErrorClassTransient && o.tool != nil:
			return s.toolWait(ctx, a, r, c, o)
		case c.Class == events.ErrorClassTransient:
			return s.transient(ctx, a, r, c, o)
		}
		r.Outcome, r.ErrorClass, r.Error = events.OutcomeFailure, c.Class, errorText(o.err)
		if events.DeploymentFault(c.Class) {
			r.Error = s.rules.deploymentError(c.Class, o.err, cmp.Or(o.endpoint, a.endpoint))
		}
		if err := s.failed(ctx, a, &r, o.hash); err != nil {
			return events.Result{}, err
		}
	}
	if err := s.settle(ctx, a); err != nil {
		return events.Result{}, err
	}
	return r, nil
}

// bannedOnRoutes are the requests of this pass banned on models the calls passed
// over (Result.Banned): this try's, and those of earlier tries of the pass
// (a redelivery's), tool calls aside.
func (a *attempt) bannedOnRoutes() []string {
	out := slices.Clone(a.bannedRoutes)
	for _, hash := range slices.Sorted(maps.Keys(a.f.bannedNow)) {
		e := hash + "/" + string(a.f.bannedNow[hash])
		if !strings.HasPrefix(hash, ToolHashPrefix) && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// failed bans a failed attempt's request when its class does (before the
// Executed goes out, so the next attempt sees it; hash "": none) and
// counts the failure.
// Its error is capped as the Executed will store it, so it compares with
// the last error the state kept.
func (s *Service) failed(ctx context.Context, a *attempt, r *events.Result, hash string) error {
	r.Error = textcut.Cut(r.Error, answerCaps.error)
	if task.Bans(r.ErrorClass) {
		if hash != "" {
			if err := s.ledger.addFailed(ctx, a.base, a.known, hash, r.ErrorClass, r.Error); err != nil {
				return err
			}
		}
		if r.Error == a.f.lastError {
			s.metrics.sameError.WithLabelValues(s.metrics.typ(a.in.Task.Type)).Inc()
		}
	}
	s.metrics.errors.WithLabelValues(s.metrics.typ(a.in.Task.Type), string(r.ErrorClass)).Inc()
	return nil
}

// cooling snoozes a task whose every model is cooling down: no call was
// made, it is neither an attempt nor a transient failure. A tool loop it
// cuts short is kept to resume.
func (s *Service) cooling(ctx context.Context, a *attempt, o outcome, wait time.Duration) (events.Result, error) {
	s.keep(ctx, a, o)
	s.metrics.snooze.WithLabelValues(snoozeCircuit).Observe(wait.Seconds())
	s.cfg.Log.Info("every model cooling down: snoozed without calling", "task", a.in.Task.ID, "type", a.in.Task.Type, "delay", wait)
	return events.Result{}, services.Snooze(wait, o.err)
}

// transient snoozes the task — Retry-After when the answer gave one, else
// the backoff over the attempt's transient count — or, past the type's
// transient budget, fails the attempt with "provider unavailable". A tool
// loop it cuts short is kept to resume.
func (s *Service) transient(ctx context.Context, a *attempt, r events.Result, c Classification, o outcome) (events.Result, error) {
	endpoint := o.endpoint
	if endpoint == "" {
		endpoint = a.endpoint
	}
	label := endpoint
	if a.route != nil && a.route.chain && endpoint == a.route.endpoint {
		// a chain's model is labelled by its name, from the bounded set
		// (its URL comes from the policy: every edit would be a series)
		label = s.metrics.routes.Label(a.route.name)
	}
	s.metrics.transient.WithLabelValues(label).Inc()
	n, err := s.ledger.cutShort(ctx, a.base, a.known, o.usage(), a.resumeOf(o), true)
	if err != nil {
		return events.Result{}, err
	}
	budget := a.pol.TransientBudget
	if budget <= 0 {
		budget = DefaultTransientBudget
	}
	if n > budget {
		if err := s.ledger.settle(ctx, a.base, a.known); err != nil {
			return events.Result{}, err
		}
		s.metrics.errors.WithLabelValues(s.metrics.typ(a.in.Task.Type), string(events.ErrorClassTransient)).Inc()
		r.Outcome, r.ErrorClass, r.TransientRetries = events.OutcomeFailure, events.ErrorClassTransient, n
		r.Error = "provider unavailable: " + errorText(o.err)
		return r, nil
	}
	delay, reason := c.RetryAfter, snoozeRetryAfter
	if delay <= 0 {
		delay, reason = s.cfg.Backoff.Delay(n, s.cfg.Rand()), snoozeBackoff
	}
	s.metrics.snooze.WithLabelValues(reason).Observe(delay.Seconds())
	s.cfg.Log.Warn("transient failure: snoozed",
		"task", a.in.Task.ID, "type", a.in.Task.Type, "pass", a.in.Run.Pass, "endpoint", endpoint,
		"transient", n, "budget", budget, "delay", delay, "reason", c.Reason, "err", o.err,
		"tokens_in", o.tokensIn, "tokens_out", o.tokensOut)
	return events.Result{}, services.Snooze(delay, o.err)
}

// parse reads the answer into r.
func (s *Service) parse(r *events.Result, content string) {
	parsed, err := ParseResult(content)
	if err != nil {
		r.Outcome, r.Error, r.ErrorClass = events.OutcomeFailure, err.Error(), events.ErrorClassInvalidOutput
		return
	}
	r.Outcome, r.Approach, r.Summary, r.Changes = parsed.Status, parsed.Approach, parsed.Summary, parsed.Changes
	if parsed.Status == events.OutcomeFailure {
		r.Error, r.ErrorClass = parsed.Summary, events.ErrorClassTask
		if r.Error == "" {
			r.Error = "the model reported failure without a summary"
		}
	}
}
