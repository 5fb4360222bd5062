// Package recorder records each attempt's outcome — outcome history (per
// type and subject), trust stats (per type) and task state — and decides what
// happens next: success ends the task; a failure sends it back through the
// verifier for another attempt until the task's attempt limit, then one
// escalation record goes to dispatch.review.escalated and the task is blocked.
//
// Every write is idempotent (keyed by the task's pass), and the decision is
// derived from the stored state, so a redelivered outcome republishes the
// same event with the same Msg-Id and changes nothing else.
package recorder

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"dispatchmesh/events"
	"dispatchmesh/history"
	"dispatchmesh/internal/kvcas"
	"dispatchmesh/internal/policy"
	"dispatchmesh/services"
	"dispatchmesh/trust"
)

// Config of the recorder.
type Config struct {
	Tasks   *services.TaskStore // required
	Trust   *trust.Store        // required
	History *history.Store      // required
	// Policy supplies each type's max_retries (default 3).
	Policy *policy.Source
	// Scoring is used to report the trust score in escalation records.
	Scoring  trust.Policy
	Instance string
	Log      *slog.Logger
	Now      func() time.Time
}

// Service is the recorder handler.
type Service struct {
	cfg Config
	log *slog.Logger
}

// New checks cfg and returns the recorder.
func New(cfg Config) (*Service, error) {
	if cfg.Tasks == nil || cfg.Trust == nil || cfg.History == nil {
		return nil, fmt.Errorf("recorder: Tasks, Trust and History stores are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg, log: cfg.Log.With("service", "recorder")}, nil
}

// Spec is the recorder's consumer: executed attempts.
func (s *Service) Spec() services.Spec {
	return services.Spec{Name: services.ConsumerRecorder, Filters: []string{events.StageFilter(events.StageExecuted)}, Handler: s.Handle, Concurrency: 8}
}

// MaxRetries is the attempt limit of a task: its own, else its type's.
func MaxRetries(t events.Task, pol policy.Type) int {
	if t.MaxRetries > 0 {
		return t.MaxRetries
	}
	if pol.MaxRetries > 0 {
		return pol.MaxRetries
	}
	return policy.DefaultMaxRetries
}

// Handle records one attempt.
func (s *Service) Handle(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	var ev events.Executed
	if err := services.Decode(m, &ev); err != nil {
		return nil, err
	}
	b, res := ev.Base, ev.Result
	t := b.Task
	now := s.cfg.Now().UTC()
	key := services.MsgID(t.ID, b.Run.Pass, "outcome")
	success := res.Outcome == events.OutcomeSuccess

	err := s.cfg.History.Append(ctx, t.Type, t.Subject, history.Entry{
		Key: key, TaskID: t.ID, Attempt: b.Run.Attempt, Rung: b.Run.Rung, Step: b.Run.Step,
		Outcome: res.Outcome, Approach: res.Approach, Summary: res.Summary, Error: res.Error, At: now,
	})
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	stats, err := s.cfg.Trust.Record(ctx, t.Type, trust.Outcome{Key: key, Success: success, At: now})
	if err != nil {
		return nil, fmt.Errorf("trust: %w", err)
	}

	limit := MaxRetries(t, s.cfg.Policy.For(t.Type))
	rec := events.AttemptRecord{
		Attempt: b.Run.Attempt, Pass: b.Run.Pass, Rung: b.Run.Rung, Step: b.Run.Step,
		Approach: res.Approach, Outcome: res.Outcome, Reason: res.Error,
		TokensIn: res.TokensIn, TokensOut: res.TokensOut, Cost: res.Cost, At: now,
	}
	st, err := s.cfg.Tasks.Update(ctx, t.ID, func(st *events.TaskState, found bool) error {
		if !found {
			*st = services.NewState(t)
		}
		if recorded(st, b.Run.Pass) || st.Pass > b.Run.Pass {
			return kvcas.ErrNoChange // a redelivery, or an old pass
		}
		apply(st, rec, limit, now)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("task state: %w", err)
	}
	if !recorded(&st, b.Run.Pass) {
		s.log.Warn("outcome of an old pass ignored", "task", t.ID, "pass", b.Run.Pass, "current", st.Pass)
		return nil, nil
	}

	b.At, b.By = now, s.cfg.Instance
	var out services.Out
	switch {
	case success:
		out, err = services.Next(b, events.StageSucceeded, events.EventSucceeded, events.Succeeded{Base: b, Result: res})
	case b.Run.Attempt >= limit:
		reason := fmt.Sprintf("gave up after %d attempts; last error: %s", b.Run.Attempt, res.Error)
		score, _, _ := trust.Score(stats.Outcomes, s.cfg.Scoring)
		esc := events.Escalated{
			Base: b, Reason: reason, TrustScore: score, Attempts: st.History,
			TokensIn: st.TokensIn, TokensOut: st.TokensOut, Cost: st.Cost,
		}
		s.log.Warn("task escalated", "task", t.ID, "attempts", b.Run.Attempt)
		out, err = services.ToReview(b, events.ReviewEscalated, events.EventEscalated, reason, esc)
	default:
		next := b
		next.Run = events.Run{Pass: b.Run.Pass + 1, Attempt: b.Run.Attempt + 1, Step: b.Run.Step, Context: res.Error}
		out, err = services.Next(next, events.StageRetry, events.EventRetry, events.Retry{Base: next, Reason: res.Error})
	}
	return []services.Out{out}, err
}

func recorded(st *events.TaskState, pass int) bool {
	for _, r := range st.History {
		if r.Pass == pass {
			return true
		}
	}
	return false
}

// apply folds one attempt into the task state.
func apply(st *events.TaskState, rec events.AttemptRecord, limit int, now time.Time) {
	st.History = append(st.History, rec)
	st.Attempts = max(st.Attempts, rec.Attempt)
	st.TokensIn += rec.TokensIn
	st.TokensOut += rec.TokensOut
	st.Cost += rec.Cost
	st.UpdatedAt = now
	switch {
	case rec.Outcome == events.OutcomeSuccess:
		st.Status, st.LastError, st.Reason = events.StatusSucceeded, "", ""
	case rec.Attempt >= limit:
		st.Status, st.LastError = events.StatusBlocked, rec.Reason
		st.Reason = fmt.Sprintf("gave up after %d attempts", rec.Attempt)
	default:
		st.Status, st.LastError = events.StatusPending, rec.Reason
		st.Pass = rec.Pass + 1
	}
}
