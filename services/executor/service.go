package executor

import (
	"context"
	"errors"
	"fmt"

	"dispatchmesh/events"
	"dispatchmesh/services"
)

// Service is the executor stage.
type Service struct {
	cfg Config
}

// New validates cfg and returns the service.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Service{cfg: cfg.withDefaults()}, nil
}

// Handle runs one prompted task through the model and returns its Executed
// event. A cancelled ctx returns ctx.Err() and nothing else (not an attempt);
// every other outcome, a failed model call included, is one Executed.
func (s *Service) Handle(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	var in events.Prompted
	if err := services.Decode(m, &in); err != nil {
		return nil, err
	}
	if !events.ValidID(in.Task.ID) {
		return nil, services.Dead(events.ReviewPoison, fmt.Errorf("prompted event has an invalid task id %q", in.Task.ID))
	}
	if len(in.Prompt.Messages) == 0 {
		return nil, services.Dead(events.ReviewPoison, fmt.Errorf("prompted event of task %s has no messages", in.Task.ID))
	}
	base := in.Base
	base.By = s.cfg.Instance
	base.At = s.cfg.Now()
	if s.cfg.Tasks != nil {
		skip, err := s.markRunning(ctx, base)
		if err != nil {
			return nil, err
		}
		if skip {
			return nil, nil
		}
	}

	req := Request{
		Model:    s.modelFor(in),
		Messages: in.Prompt.Messages,
		TaskType: in.Task.Type,
		TaskID:   in.Task.ID,
		Attempt:  in.Run.Attempt,
	}
	start := s.cfg.Now()
	resp, err := s.cfg.Model.Complete(ctx, req)
	end := s.cfg.Now()
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err() // shutdown, not an attempt: nak and redeliver
	}
	result := s.result(req, resp, err)
	result.DurationMS = end.Sub(start).Milliseconds()
	s.logCall(in, result)

	base.At = end
	out, err := services.Next(base, events.StageExecuted, events.EventExecuted, events.Executed{Base: base, Result: result})
	if err != nil {
		return nil, err
	}
	return []services.Out{out}, nil
}

// markRunning sets the task running for this pass. skip is true when the
// task has moved past this pass or ended: a late redelivery spends nothing.
func (s *Service) markRunning(ctx context.Context, base events.Base) (skip bool, err error) {
	st, err := s.cfg.Tasks.Get(ctx, base.Task.ID)
	switch {
	case errors.Is(err, services.ErrTaskNotFound):
	case err != nil:
		return false, s.storeErr(ctx, err)
	case st.Pass > base.Run.Pass || events.Terminal(st.Status):
		s.cfg.Log.Info("prompt skipped: the task has moved on",
			"task", base.Task.ID, "pass", base.Run.Pass, "task_pass", st.Pass, "status", st.Status)
		return true, nil
	}
	if _, err := s.cfg.Tasks.SetStatus(ctx, base, events.StatusRunning, ""); err != nil {
		return false, s.storeErr(ctx, err)
	}
	return false, nil
}

func (s *Service) storeErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("executor: task state: %w", err)
}

// modelFor picks the model: the prompt's, then the type's policy, then the default.
func (s *Service) modelFor(in events.Prompted) string {
	if in.Prompt.Model != "" {
		return in.Prompt.Model
	}
	if m := s.cfg.Policy.For(in.Task.Type).Model; m != "" {
		return m
	}
	return s.cfg.DefaultModel
}

// result turns one model call into the attempt's Result.
func (s *Service) result(req Request, resp Response, err error) events.Result {
	if err != nil {
		return events.Result{
			Outcome: events.OutcomeFailure, Error: err.Error(), ErrorClass: ErrorClassModel, Model: req.Model,
		}
	}
	r := events.Result{
		Model:     req.Model,
		Simulated: resp.Simulated,
		TokensIn:  resp.TokensIn,
		TokensOut: resp.TokensOut,
		Cost:      s.cost(req.Model, resp),
	}
	if resp.Model != "" {
		r.Model = resp.Model
	}
	parsed, err := ParseResult(resp.Content)
	if err != nil {
		r.Outcome, r.Error, r.ErrorClass = events.OutcomeFailure, err.Error(), ErrorClassInvalidOutput
		return r
	}
	r.Outcome, r.Approach, r.Summary, r.Changes = parsed.Status, parsed.Approach, parsed.Summary, parsed.Changes
	if parsed.Status == events.OutcomeFailure {
		r.Error, r.ErrorClass = parsed.Summary, ErrorClassTask
		if r.Error == "" {
			r.Error = "the model reported failure without a summary"
		}
	}
	return r
}

func (s *Service) cost(requested string, resp Response) float64 {
	if p, ok := s.cfg.Prices[requested]; ok {
		return p.Cost(resp.TokensIn, resp.TokensOut)
	}
	if p, ok := s.cfg.Prices[resp.Model]; ok {
		return p.Cost(resp.TokensIn, resp.TokensOut)
	}
	return 0
}

func (s *Service) logCall(in events.Prompted, r events.Result) {
	attrs := []any{
		"task", in.Task.ID, "type", in.Task.Type, "pass", in.Run.Pass, "attempt", in.Run.Attempt,
		"model", r.Model, "tokens_in", r.TokensIn, "tokens_out", r.TokensOut, "cost", r.Cost,
		"duration_ms", r.DurationMS, "outcome", r.Outcome,
	}
	if r.Outcome == events.OutcomeSuccess {
		s.cfg.Log.Info("model call", attrs...)
		return
	}
	s.cfg.Log.Warn("model call", append(attrs, "error_class", r.ErrorClass, "error", r.Error)...)
}
