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
//
// It also hears the human review actions (dispatch.review.action.<id>,
// Config.NATS): it writes nothing for them, and counts a task that a
// human's resolve, reject or cancel ended (action.go).
package recorder

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Service is the recorder handler.
type Service struct {
	cfg Config
	log *slog.Logger
	// metrics count each outcome once (metrics.go).
	metrics *metrics
	// actions hears the review actions (nil without Config.NATS).
	actions *nats.Subscription
}

// New checks cfg and returns the recorder; with cfg.NATS it hears the
// review actions until Close.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, log: cfg.Log.With("service", "recorder"), metrics: newMetrics(cfg.Registry, cfg.TypeLabels)}
	if cfg.NATS != nil {
		if err := s.hearActions(cfg.NATS); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Close stops hearing the review actions.
func (s *Service) Close() {
	if s.actions != nil {
		_ = s.actions.Unsubscribe()
	}
}

// Spec is the recorder's consumer: executed attempts, one filter. (A
// second filter on a durable makes nats-server 2.15 intersect the subjects
// of the stream's message block with the filters for each message it
// delivers while the consumer is behind: the thousands of task subjects of
// a block, for every attempt a busy recorder records.)
func (s *Service) Spec() services.Spec {
	return services.Spec{Name: services.ConsumerRecorder, Filters: []string{events.StageFilter(events.StageExecuted)},
		Handler: s.Handle, Concurrency: 8, Prefetch: services.FastPrefetch, Stop: s.Close}
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
	// The executor's event carries the state as it left it: the
	// compare-and-set starts from there (and reads on a conflict). A
	// redelivery's was most likely replaced by its first delivery: read.
	known := ev.State
	if m.Delivered > 1 {
		known = nil
	}
	shadow := s.cfg.Shadow.Snapshot()
	var shadowed *events.ShadowDecision
	at, cause, err := s.cfg.Tasks.ApplyAt(ctx, t.ID, known, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		next, judged, c := task.Record(st, found, b, ev.Result, pol, now)
		res = judged
		shadowed = shadowRecord(shadow, st, found, b, ev.Result, now)
		return next, c
	})
	st := at.State
	if err != nil {
		return nil, fmt.Errorf("task state: %w", err)
	}
	if cause.Changed() {
		s.metrics.recorded(&st)
		s.metrics.shadow.Count(t.Type, string(st.Decision), shadowed) // once: a redelivery changes nothing
		if shadowed != nil && shadowed.Act != string(st.Decision) {
			s.log.Info("the shadow policy decides otherwise", "task", t.ID, "type", t.Type, "pass", b.Run.Pass,
				"live", st.Decision, "shadow", shadowed.Act, "shadow_reason", shadowed.Reason, "shadow_rev", shadowed.PolicyRev)
		}
	}

	if cause == task.CauseMovedOn || cause == task.CauseEnded {
		s.log.Warn("outcome of an earlier pass or an ended task ignored", "task", t.ID, "pass", b.Run.Pass, "current", st.Pass, "status", st.Status)
		return nil, nil
	}
	// What the attempt adds to the subject's history (a compare-and-set
	// on its record; only what the model did there: task.CountsForHistory),
	// to its type's trust and to its spend of the day (messages published
	// before the task moves on, each with the attempt's key in its
	// Msg-Id): a redelivery stores nothing twice.
	key := services.MsgID(t.ID, b.Run.Pass, "outcome")
	if task.CountsForHistory(res) {
		err = s.cfg.History.Append(ctx, t.Type, t.Subject, history.Entry{
			Key: key, TaskID: t.ID, Attempt: b.Run.Attempt, Rung: b.Run.Rung, Step: b.Run.Step,
			Outcome: res.Outcome, Approach: res.Approach, Summary: res.Summary, Error: res.Error, At: now,
		})
		if err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
	}
	outs, counted, err := s.recorded(t, st, b.Run, res, key, now, pol.DailyBudget)
	if err != nil {
		return nil, err
	}
	if !task.AsRecorded(st, b.Run.Pass) {
		// A redelivery after the task moved on (the next pass started, the
		// gate stopped it, a human acted): whatever this attempt led to was
		// published when it was first recorded.
		s.log.Warn("outcome of a pass the task has moved past: nothing to publish again", "task", t.ID, "pass", b.Run.Pass, "current", st.Pass, "status", st.Status)
		return outs, nil
	}

	b.At, b.By, b.PolicyRev = now, s.cfg.Instance, snap.Rev
	e := task.Emit(st, b, res, pol, s.score(t.Type, st, pol, counted))
	e.Event = s.carry(e.Event, shadowed, at)
	var out services.Out
	switch {
	case e.Review == "":
		out, err = services.Next(e.Base, e.Stage, e.Name, e.Event)
	default:
		s.log.Warn("task to review", "task", t.ID, "review", e.Review, "attempts", st.Attempts, "skips", st.Skips, "reason", st.Reason)
		out, err = services.ToReview(e.Base, e.Review, e.Name, e.Reason, e.Event)
	}
	return append(outs, out), err
}

// score is the trust score of taskType, with this attempt's outcome
// (counted, nil: none) in its window, that an escalation record reports;
// 0 for a task the attempt did not hand off or fail.
func (s *Service) score(taskType string, st events.TaskState, pol policy.Type, counted *trust.Outcome) float64 {
	score := 0.0 // reported by an escalation record only
	if st.Decision == events.DecisionHandoff || st.Decision == events.DecisionFail {
		scoring := pol.Scoring(s.cfg.Scoring) // the type's window and weights
		stats := s.cfg.Trust.Stats(taskType)
		if counted != nil { // the type's window with this outcome in it
			stats, _ = scoring.Record(stats, *counted)
		}
		score, _, _ = trust.Score(stats.Outcomes, scoring)
	}
	return score
}

// recorded is what an attempt's outcome adds to its type's trust window and
// to its spend of the day (the units its daily budget caps: task.DailySpend),
// as messages to publish, and the trust outcome it counts (nil: none).
func (s *Service) recorded(t events.Task, st events.TaskState, run events.Run, res events.Result, key string, now time.Time, daily *policy.Budget) ([]services.Out, *trust.Outcome, error) {
	var (
		msgs    []*nats.Msg
		counted *trust.Outcome
	)
	if task.CountsForTrust(res) {
		o := task.TrustOutcome(key, st, run, res, now)
		m, err := trust.OutcomeMsg(t.Type, o)
		if err != nil {
			return nil, nil, services.Dead(events.ReviewPoison, err)
		}
		msgs, counted = append(msgs, m), &o
	}
	if tokens, cost := task.DailySpend(res, daily); s.cfg.CountSpend && (tokens != 0 || cost != 0) {
		spend, err := trust.SpendMsgs(t.Type, key, now, tokens, cost)
		if err != nil {
			return nil, nil, services.Dead(events.ReviewPoison, err)
		}
		msgs = append(msgs, spend...)
	}
	outs := make([]services.Out, len(msgs))
	for i, m := range msgs {
		outs[i] = services.OutMsg(m)
	}
	return outs, counted, nil
}

// shadowRecord is the recorder's decision on the attempt under the shadow
// policy (nil when there is none): task.Record on the same state, its
// result dropped — never written, never enforced.
func shadowRecord(shadow *policy.Snapshot, st events.TaskState, found bool, b events.Base, res events.Result, now time.Time) *events.ShadowDecision {
	if shadow == nil || shadow.File == nil {
		return nil
	}
	next, _, c := task.Record(st, found, b, res, shadow.For(b.Task.Type), now)
	if !c.Changed() {
		return nil
	}
	return &events.ShadowDecision{Act: string(next.Decision), Reason: next.Reason, PolicyRev: shadow.Rev}
}

// carry puts on the recorder's next event what it carries besides the
// outcome: the shadow policy's decision, and on a retry or the next step
// the state as recorded at, sealed (the next executor's write starts from it).
func (s *Service) carry(ev any, shadow *events.ShadowDecision, at events.StateAt) any {
	switch ev := ev.(type) {
	case events.Retry:
		ev.Sealed, ev.Shadow = s.cfg.Tasks.Seal(at), shadow
		return ev
	case events.Verified:
		ev.Sealed, ev.Shadow = s.cfg.Tasks.Seal(at), shadow
		return ev
	case events.Succeeded:
		ev.Shadow = shadow
		return ev
	case events.Escalated:
		ev.Shadow = shadow
		return ev
	case events.Stuck:
		ev.Shadow = shadow
		return ev
	}
	return ev
}
