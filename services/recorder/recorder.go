// Package recorder records each attempt's outcome — outcome history (per
// type and subject), trust stats (per type) and task state — and decides what
// happens next: success ends the task; a failure sends it back through the
// verifier for another attempt until the task's attempt limit, then one
// escalation record goes to dispatch.review.escalated and the task is blocked.
// Failures climb the escalation ladder (package ladder); a pipeline type
// routes between its steps instead.
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

	"github.com/prometheus/client_golang/prometheus"

	"dispatchmesh/events"
	"dispatchmesh/history"
	"dispatchmesh/internal/kvcas"
	"dispatchmesh/internal/ladder"
	"dispatchmesh/internal/policy"
	"dispatchmesh/services"
	"dispatchmesh/trust"
)

// Config of the recorder.
type Config struct {
	Tasks   *services.TaskStore // required
	Trust   *trust.Store        // required
	History *history.Store      // required
	// Spending counts what each type spent per day (the gate's daily
	// budget). Default: not counted.
	Spending *trust.Spending
	// Policy supplies each type's max_retries (default 7) and pipeline.
	Policy *policy.Source
	// Scoring is used to report the trust score in escalation records.
	Scoring  trust.Policy
	Instance string
	Log      *slog.Logger
	Now      func() time.Time
	// Registry receives the spend metrics (see metrics.go). Default: nil,
	// no metrics are registered.
	Registry prometheus.Registerer
}

// Service is the recorder handler.
type Service struct {
	cfg Config
	log *slog.Logger
	// metrics count each outcome once (metrics.go).
	metrics *metrics
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
	return &Service{cfg: cfg, log: cfg.Log.With("service", "recorder"), metrics: newMetrics(cfg.Registry)}, nil
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
	// The attempt is dated by when the stream stored its outcome, not by
	// when this instance handles it: a redelivery writes the same values, and
	// dispatch rebuild, replaying the stream, recomputes them exactly.
	now := m.Time.UTC()
	if m.Time.IsZero() {
		now = s.cfg.Now().UTC()
	}
	snap := s.cfg.Policy.Snapshot()
	pol := snap.For(t.Type)

	// State first: the PIVOT rule needs the dead ends, and the stored
	// record makes a redelivery see the same judgement.
	stale := false
	fresh := false // this attempt was recorded now, not on an earlier delivery
	st, err := s.cfg.Tasks.Update(ctx, t.ID, func(st *events.TaskState, found bool) error {
		fresh = false
		if !found {
			*st = services.NewState(t)
		}
		if r, ok := recordOf(st, b.Run.Pass); ok {
			res.Outcome, res.Error = r.Outcome, r.Reason // judged when first recorded
			return kvcas.ErrNoChange
		}
		if st.Pass > b.Run.Pass || events.Terminal(st.Status) {
			// An old pass, or a task that ended while its model answered
			// (a human cancelled it): never recorded, never retried.
			stale = true
			return kvcas.ErrNoChange
		}
		judged := Judge(b.Run, ev.Result, st.DeadEnds, len(pol.Steps) > 0)
		Apply(st, t, b.Run, judged, pol, now)
		res = judged
		fresh = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("task state: %w", err)
	}
	if fresh {
		s.metrics.recorded(&st)
	}

	if stale {
		s.log.Warn("outcome of an earlier pass or an ended task ignored", "task", t.ID, "pass", b.Run.Pass, "current", st.Pass, "status", st.Status)
		return nil, nil
	}
	key := services.MsgID(t.ID, b.Run.Pass, "outcome")
	err = s.cfg.History.Append(ctx, t.Type, t.Subject, history.Entry{
		Key: key, TaskID: t.ID, Attempt: b.Run.Attempt, Rung: b.Run.Rung, Step: b.Run.Step,
		Outcome: res.Outcome, Approach: res.Approach, Summary: res.Summary, Error: res.Error, At: now,
	})
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	// A task that ends gives up its canary place, if it held one.
	release := ""
	if st.Decision != events.DecisionRetry {
		release = t.ID
	}
	var stats trust.Stats
	switch {
	case CountsForTrust(res):
		stats, err = s.cfg.Trust.Record(ctx, t.Type, TrustOutcome(key, b.Run, res, now), release)
	case release != "":
		stats, err = s.cfg.Trust.Release(ctx, t.Type, release)
	default:
		stats, err = s.cfg.Trust.Get(ctx, t.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("trust: %w", err)
	}
	if s.cfg.Spending != nil {
		if err := s.cfg.Spending.Add(ctx, t.Type, key, now, res.TokensIn+res.TokensOut, res.Cost); err != nil {
			return nil, err
		}
	}
	if last, ok := lastRecord(&st); !ok || last.Pass != b.Run.Pass {
		// The task moved on (or this is an old pass): whatever this attempt
		// led to was published when it was first recorded.
		s.log.Warn("outcome of an earlier pass ignored", "task", t.ID, "pass", b.Run.Pass, "current", st.Pass)
		return nil, nil
	}

	b.At, b.By, b.PolicyRev = now, s.cfg.Instance, snap.Rev
	var out services.Out
	switch st.Decision {
	case events.DecisionSucceeded:
		out, err = services.Next(b, events.StageSucceeded, events.EventSucceeded, events.Succeeded{Base: b, Result: res})
	case events.DecisionRetry, events.DecisionPark:
		next := b
		next.Run = NextRun(&st, b.Run, res, pol)
		retry := events.Retry{Base: next, Reason: oneLine(res.Error), WakeAt: st.WakeAt}
		if st.Decision == events.DecisionPark {
			retry.Reason = st.Reason
		}
		out, err = services.Next(next, events.StageRetry, events.EventRetry, retry)
	case events.DecisionStuck:
		s.log.Warn("task stuck", "task", t.ID, "skips", st.Skips)
		out, err = services.ToReview(b, events.ReviewStuck, events.EventStuck, st.Reason,
			events.Stuck{Base: b, Reason: st.Reason, Skips: st.Skips, Attempts: st.History})
	default: // handoff, fail
		score, _, _ := trust.Score(stats.Outcomes, s.cfg.Scoring)
		s.log.Warn("task escalated", "task", t.ID, "attempts", st.Attempts, "reason", st.Reason)
		out, err = services.ToReview(b, events.ReviewEscalated, events.EventEscalated, st.Reason, events.Escalated{
			Base: b, Reason: st.Reason, TrustScore: score, Attempts: st.History,
			TokensIn: st.TokensIn, TokensOut: st.TokensOut, Cost: st.Cost,
		})
	}
	return []services.Out{out}, err
}

// Judge applies the PIVOT rule: an answer whose declared approach repeats a
// dead end is rejected — a failed attempt, not progress.
func Judge(run events.Run, res events.Result, deadEnds []events.DeadEnd, pipeline bool) events.Result {
	if pipeline || run.Rung != events.RungPivot {
		return res
	}
	if d, ok := ladder.RepeatsDeadEnd(res.Approach, deadEnds); ok {
		res.Outcome, res.ErrorClass = events.OutcomeFailure, events.ErrorClassDeadEnd
		res.Error = fmt.Sprintf("rejected: approach %q repeats the dead end of attempt %d (%s); PIVOT requires a different approach",
			res.Approach, d.Attempt, oneLine(d.Reason))
	}
	return res
}

// TrustOutcome is what an attempt adds to its type's trust stats.
func TrustOutcome(key string, run events.Run, res events.Result, at time.Time) trust.Outcome {
	return trust.Outcome{
		Key: key, Success: res.Outcome == events.OutcomeSuccess, At: at,
		Tokens: res.TokensIn + res.TokensOut, Cost: res.Cost,
		Rung: run.Rung, Retry: run.Attempt > 1,
	}
}

// CountsForTrust reports whether an outcome says something about how well
// the type's tasks go. Failures the model did not cause — a provider that
// stayed unavailable, a request refused before it was sent, and every fault
// of the deployment (events.DeploymentFault: a bad API key, an exhausted
// quota, a misconfigured model, a tool that does not answer) — must not get
// a type gated.
func CountsForTrust(res events.Result) bool {
	if res.Outcome == events.OutcomeSuccess {
		return true
	}
	switch {
	case res.ErrorClass == events.ErrorClassTransient, res.ErrorClass == events.ErrorClassRefused,
		events.DeploymentFault(res.ErrorClass):
		return false
	}
	return true
}

func recordOf(st *events.TaskState, pass int) (events.AttemptRecord, bool) {
	for _, r := range st.History {
		if r.Pass == pass {
			return r, true
		}
	}
	return events.AttemptRecord{}, false
}

func lastRecord(st *events.TaskState) (events.AttemptRecord, bool) {
	if len(st.History) == 0 {
		return events.AttemptRecord{}, false
	}
	return st.History[len(st.History)-1], true
}
