// Package verifier is the staleness check of dispatchmesh: before any token
// is spent, and again before every retry, it asks the task type's verifier
// whether the task's problem still exists.
//
// It consumes task.queued.v1 and task.retry.v1 and publishes one event:
//
//	exists, skipped          task.verified.v1  (on to the gate)
//	stale                    task.cancelled.v1 (status cancelled, no model call)
//	error, fail-open         task.verified.v1  with verdict error, fail_open true
//	error, fail-closed       task.cancelled.v1 with verdict error
//
// Verifiers (policy.Verifier) are a NATS request-reply endpoint, an HTTP
// endpoint, a command's exit code, or none.
package verifier

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Service is the verifier stage.
type Service struct {
	cfg     Config
	metrics *services.TaskMetrics
	kinds   map[string]factory
}

// New checks cfg and returns the service. It fails when the current policy
// is invalid or names a nats verifier while cfg.NC is nil.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, metrics: services.NewTaskMetrics(cfg.Registry, cfg.TypeLabels)}
	s.kinds = s.registry()
	return s, nil
}

// input is a queued or a retry event: both carry Base, retry adds Reason and,
// for a parked task, WakeAt.
type input struct {
	events.Base
	Reason string    `json:"reason"`
	WakeAt time.Time `json:"wake_at,omitzero"`
	// Sealed is the task's state as it was last written (events.Sealed).
	Sealed *events.Sealed `json:"sealed,omitempty"`
}

// Handle checks the task of a queued or retry event and publishes its verdict.
func (s *Service) Handle(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	var in input
	if err := services.Decode(m, &in); err != nil {
		return nil, err
	}
	if !events.ValidID(in.Task.ID) {
		return nil, services.Dead(events.ReviewPoison, fmt.Errorf("%s: invalid task id %q", m.Subject, in.Task.ID))
	}
	b := in.Base
	now := s.cfg.Now().UTC()
	if wait := in.WakeAt.Sub(now); wait > 0 {
		// A parked task: hold it (a delayed nak) until it is due.
		return nil, services.Snooze(wait, fmt.Errorf("task %s parked until %s", b.Task.ID, in.WakeAt.Format(time.RFC3339)))
	}
	pol := s.cfg.Policy.Snapshot()
	b.At, b.By, b.PolicyRev = now, s.cfg.Instance, pol.Rev
	typ := pol.For(b.Task.Type)
	pv := *typ.Verifier
	log := s.cfg.Log.With("task", b.Task.ID, "type", b.Task.Type, "pass", b.Run.Pass, "verifier", kind(pv))
	log.Debug("verifying", "reason", in.Reason)
	if s.cfg.Tasks != nil && (typ.Verifies() || m.Delivered > 1) {
		// A task that ended is not verified again — unless this verifier
		// ended it (stale) and this is a redelivery: then its cancelled
		// event is published again below (the Msg-Id deduplicates). With
		// no verifier there is nothing to save by reading the state first:
		// a task a human cancelled is skipped where it would cost, by the
		// executor.
		ended, st, err := s.cfg.Tasks.Ended(ctx, b.Task.ID)
		if err != nil {
			return nil, s.fail(ctx, fmt.Errorf("read task state: %w", err))
		}
		if ended && st.Pass >= b.Run.Pass && (st.Status != events.StatusCancelled || task.EndedByHuman(st)) {
			log.Info("task has ended: not verified", "status", st.Status)
			return nil, nil
		}
	}

	sealed := in.Sealed // relayed as it came, unless this service writes the state
	if typ.Verifies() && s.cfg.Tasks != nil {
		at, _, err := s.cfg.Tasks.ApplyAt(ctx, b.Task.ID, s.cfg.Tasks.Open(b.Task.ID, in.Sealed), func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Verifying(st, found, b)
		})
		if err != nil {
			return nil, s.fail(ctx, fmt.Errorf("set status verifying: %w", err))
		}
		sealed = s.cfg.Tasks.Seal(at)
	}
	v, err := s.check(ctx, b.Task, pv)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		v = events.Verification{
			Verdict: events.VerdictError, Verifier: kind(pv),
			Detail: clip(err.Error()), FailOpen: !pv.FailClosed,
		}
		log.Warn("verifier failed", "err", err, "fail_open", v.FailOpen)
	}

	switch {
	case v.Verdict == events.VerdictExists, v.Verdict == events.VerdictSkipped, v.FailOpen:
		return outs(services.Next(b, events.StageVerified, events.EventVerified, events.Verified{Base: b, Verification: v, Sealed: sealed}))
	case v.Verdict == events.VerdictStale:
		log.Info("task is stale; cancelled", "detail", v.Detail)
		return s.cancel(ctx, b, v)
	default: // verdict error, fail-closed
		return s.cancel(ctx, b, v)
	}
}

// SpanCheck is the span of one verifier call (a child of the verifier's
// stage span when traced), with its kind (AttrKind) and verdict
// (AttrVerdict).
const (
	SpanCheck   = "verifier.check"
	AttrKind    = "dispatch.verifier.kind"
	AttrVerdict = "dispatch.verifier.verdict"
)

// check runs pv's checker on t. A checker answering something other than
// exists, stale or skipped is an error.
func (s *Service) check(ctx context.Context, t events.Task, pv policy.Verifier) (events.Verification, error) {
	c, err := s.CheckerFor(pv)
	if err != nil {
		return events.Verification{}, err
	}
	cctx, span := tracing.Child(ctx, SpanCheck, trace.SpanKindClient)
	v, err := c.Check(cctx, t)
	if span.IsRecording() {
		span.SetAttributes(attribute.String(AttrKind, kind(pv)), attribute.String(AttrVerdict, string(v.Verdict)))
	}
	tracing.End(span, err)
	if err != nil {
		return v, err
	}
	switch v.Verdict {
	case events.VerdictExists, events.VerdictStale, events.VerdictSkipped:
		v.Verifier = kind(pv)
		return v, nil
	}
	return v, fmt.Errorf("%s verifier answered verdict %q", kind(pv), v.Verdict)
}

// cancel records the task as cancelled (when Tasks is set) and emits Cancelled.
func (s *Service) cancel(ctx context.Context, b events.Base, v events.Verification) ([]services.Out, error) {
	if s.cfg.Tasks != nil {
		_, cause, err := s.cfg.Tasks.Apply(ctx, b.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Cancel(st, found, b, v)
		})
		if err != nil {
			return nil, s.fail(ctx, fmt.Errorf("set status cancelled: %w", err))
		}
		if cause.Changed() {
			s.metrics.Finish(b.Task.Type, events.StatusCancelled, services.EndedByVerifier, b.At.Sub(b.Task.SubmittedAt))
		}
	}
	return outs(services.Next(b, events.StageCancelled, events.EventCancelled, events.Cancelled{Base: b, Verification: v}))
}

// fail returns ctx's error when the service is shutting down, err otherwise
// (the router naks and retries).
func (s *Service) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func outs(o services.Out, err error) ([]services.Out, error) {
	if err != nil {
		return nil, err
	}
	return []services.Out{o}, nil
}
