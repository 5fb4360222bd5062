// Package gate is the trust gate: before a task is dispatched it checks the
// trust score of the task's type (SPEC §4). A type scoring below the
// threshold is not dispatched: the task goes to dispatch.review.gated with
// status needs_human_review and the reason. Exempt types always pass, and
// after ProbeAfter consecutive blocks one task is let through as a probe to
// re-measure the type. The trust check applies to a task's first pass: a
// retry of an admitted task climbs the escalation ladder instead. A type
// over its daily budget is blocked with reason "budget" (retries too); a
// task a human requeued is let through.
package gate

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"dispatchmesh/events"
	"dispatchmesh/internal/policy"
	"dispatchmesh/services"
	"dispatchmesh/trust"
)

// Config of the gate.
type Config struct {
	// Trust is the trust stats store (required).
	Trust *trust.Store
	// Tasks, when set, gets status needs_human_review for blocked tasks.
	Tasks *services.TaskStore
	// Policy supplies per-type exemption and threshold overrides.
	Policy *policy.Source
	// Trust scoring defaults (window 50, minimum 10, threshold 0.15, probe
	// after 5 blocks); a type's policy threshold overrides Threshold.
	Scoring trust.Policy
	// Instance names this process in events.
	Instance string
	Log      *slog.Logger
	Now      func() time.Time
}

// Service is the gate handler.
type Service struct {
	cfg Config
	log *slog.Logger
}

// New checks cfg and returns the gate.
func New(cfg Config) (*Service, error) {
	if cfg.Trust == nil {
		return nil, fmt.Errorf("gate: Trust store is required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg, log: cfg.Log.With("service", "gate")}, nil
}

// Spec is the gate's consumer: verified tasks.
func (s *Service) Spec() services.Spec {
	return services.Spec{Name: services.ConsumerGate, Filters: []string{events.StageFilter(events.StageVerified)}, Handler: s.Handle, Concurrency: 8}
}

// Handle decides whether one verified task may be dispatched.
func (s *Service) Handle(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	var ev events.Verified
	if err := services.Decode(m, &ev); err != nil {
		return nil, err
	}
	b := ev.Base
	b.At, b.By = s.cfg.Now().UTC(), s.cfg.Instance

	pol := s.cfg.Policy.For(b.Task.Type)
	scoring := s.cfg.Scoring
	switch {
	case pol.Threshold == nil:
	case *pol.Threshold == 0:
		scoring.Threshold = -1 // an explicit 0: never gate the type
	default:
		scoring.Threshold = *pol.Threshold
	}
	scoring.Exempt = []string{}
	stats, err := s.cfg.Trust.Get(ctx, b.Task.Type)
	if err != nil {
		return nil, err
	}
	v := scoring.Evaluate(b.Task.Type, stats)
	d := events.TrustDecision{Score: v.Score, Outcomes: v.Outcomes, Threshold: v.Threshold, Exempt: pol.IsExempt()}

	key := services.MsgID(b.Task.ID, b.Run.Pass, "gate")
	spent := stats.SpentOn(b.At)
	switch {
	case b.Run.Reviewed:
		d.Reason = "requeued by a human reviewer"
	case pol.DailyBudget.Exceeded(spent.Tokens, spent.Cost):
		reason := fmt.Sprintf("Blocked: %s budget: spent %d tokens and $%.4f today, over its daily budget", b.Task.Type, spent.Tokens, spent.Cost)
		d.Blocked, d.Reason = true, reason
		return s.block(ctx, b, d)
	case b.Run.Pass > 1:
		// The trust gate decides whether a task is dispatched at all; once
		// admitted, its retries climb the escalation ladder, which has its
		// own end (max_retries), and a pipeline's steps follow their policy.
		d.Reason = "retry of an admitted task"
	case d.Exempt:
	case !v.Below:
		if stats.BlockStreak > 0 { // the type recovered: the block streak ends
			if _, _, err := s.cfg.Trust.Gate(ctx, b.Task.Type, key, false); err != nil {
				return nil, err
			}
		}
	default:
		probe, streak, err := s.cfg.Trust.Gate(ctx, b.Task.Type, key, true)
		if err != nil {
			return nil, err
		}
		if probe {
			d.Probe = true
			s.log.Info("exploration probe let through", "task", b.Task.ID, "type", b.Task.Type, "score", v.Score)
			break
		}
		d.Blocked, d.Reason = true, v.Reason
		s.log.Info("task gated", "task", b.Task.ID, "type", b.Task.Type, "reason", v.Reason, "streak", streak)
		return s.block(ctx, b, d)
	}
	out, err := services.Next(b, events.StageAdmitted, events.EventAdmitted, events.Admitted{Base: b, Trust: d})
	return []services.Out{out}, err
}

// block files the task for human review with status needs_human_review.
func (s *Service) block(ctx context.Context, b events.Base, d events.TrustDecision) ([]services.Out, error) {
	if s.cfg.Tasks != nil {
		if err := s.cfg.Tasks.SetStatus(ctx, b, events.StatusNeedsHumanReview, d.Reason); err != nil {
			return nil, err
		}
	}
	out, err := services.ToReview(b, events.ReviewGated, events.EventGated, d.Reason, events.Gated{Base: b, Trust: d, Reason: d.Reason})
	return []services.Out{out}, err
}
