// Package intake accepts tasks. Clients publish to dispatch.submit.<type>
// (fire and forget, any language); the intake service validates each
// submission, creates the task's state once (the same id submitted twice
// makes one task) and publishes task.queued for the verifier. Bad input is
// kept on dispatch.review.rejected with its original bytes and the error.
//
// The same package serves the synchronous submit endpoint (a micro service on
// dispatch.api.submit) that answers the task id or the validation error.
package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Service is the intake handler.
type Service struct {
	cfg Config
	log *slog.Logger
}

// New checks cfg and returns the service.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Service{cfg: cfg, log: cfg.Log.With("service", "intake")}, nil
}

// Spec is the service's consumer, on the submissions' own stream: every
// submission, bare dispatch.submit included (it names no type: it is rejected, not lost).
func (s *Service) Spec() services.Spec {
	return services.Spec{Name: services.ConsumerIntake, Stream: services.SubmitStream, Filters: events.SubmitFilters, Handler: s.Handle, Concurrency: 8, Prefetch: services.FastPrefetch}
}

// Handle accepts one submission.
func (s *Service) Handle(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	sub, err := events.DecodeSubmitFrom(m.Subject, m.Data)
	if err != nil {
		return nil, services.DeadKey(events.ReviewRejected, sub.ID, err) // "" when no id can be read: seq-N
	}
	t := sub.Task(events.GeneratedID(m.Seq, m.Time), m.Time)
	pol := s.cfg.Policy.Snapshot()
	switch reject, err := s.unnamed(ctx, t, pol, m.Seq); {
	case err != nil:
		return nil, err
	case reject != nil:
		return nil, services.DeadKey(events.ReviewRejected, sub.ID, reject)
	}
	run := firstRun(t, pol)
	st := task.Queued(t, run, m.Seq)
	created, at, err := s.cfg.Tasks.Create(ctx, st)
	if err != nil {
		return nil, err
	}
	// A task that exists was created by an earlier delivery of this very
	// message (publish again, as it was decided then: the Msg-Id
	// deduplicates), or by another submission of the same id (one task:
	// nothing to do).
	publish := created || at.State.SubmitSeq == m.Seq
	if !created {
		run.Rung, run.Step = at.State.Rung, at.State.Step
	}
	if !publish {
		// Another submission of the id: the same task is nothing to do;
		// another body is kept as a rejection, saying what differs (the
		// API answers it 409 before it is queued).
		var diff []string
		if s.cfg.JS != nil {
			stream, err := s.cfg.JS.Stream(ctx, services.SubmitStream)
			if err != nil {
				return nil, err
			}
			if diff, err = Resubmitted(ctx, stream, at.State, sub); err != nil {
				return nil, err
			}
		}
		if len(diff) > 0 {
			return nil, services.DeadKey(events.ReviewRejected, sub.ID+"-"+strconv.FormatUint(m.Seq, 10),
				errors.New(conflict(t.ID, diff)))
		}
		s.log.Info("duplicate submission ignored", "task", t.ID, "seq", m.Seq)
		return nil, nil
	}
	b := events.Base{Task: t, Run: run, At: s.cfg.Now().UTC(), By: s.cfg.Instance, PolicyRev: pol.Rev}
	// The index entry: the task explorer lists every task that was queued.
	// Same decision, deterministic Msg-Id: one entry per task. No stage
	// reads it, so it is published with the task's first event rather than
	// before it; the submission is acked once both are stored.
	entry := events.IndexEntry{ID: t.ID, Type: t.Type, Subject: t.Subject, SubmittedAt: t.SubmittedAt}
	idx, err := services.Emit(events.IndexSubject(t.Type, t.Subject), services.MsgID(t.ID, 1, "index"), events.EventIndexed, t.ID, entry)
	if err != nil {
		return nil, err
	}
	idx.WithLast = true
	// A type without a verifier has nothing to verify: its task goes to the
	// gate at once, verified (verdict skipped) instead of queued.
	// Either carries the state as created, sealed, for the executor.
	sealed := s.cfg.Tasks.Seal(at)
	var out services.Out
	if pol.For(t.Type).Verifies() {
		out, err = services.Next(b, events.StageQueued, events.EventQueued, events.Queued{Base: b, Sealed: sealed})
	} else {
		v := task.Unverified(b, "")
		v.Sealed = sealed
		out, err = services.Next(b, events.StageVerified, events.EventVerified, v)
	}
	if err != nil {
		return nil, err
	}
	return []services.Out{idx, out}, nil
}

// unnamed is the rejection of task t, submitted at seq, when only the types
// the policy names are accepted and pol does not name its type (nil
// otherwise); err is a failure to find out. A task this very submission
// created before the policy stopped naming its type goes on as decided
// then (a redelivery).
func (s *Service) unnamed(ctx context.Context, t events.Task, pol *policy.Snapshot, seq uint64) (reject, err error) {
	reject = knownType(s.cfg.KnownTypesOnly, pol, t.Type)
	if reject == nil {
		return nil, nil
	}
	st, err := s.cfg.Tasks.Get(ctx, t.ID)
	switch {
	case errors.Is(err, services.ErrTaskNotFound):
		return reject, nil
	case err != nil:
		return nil, err
	case st.SubmitSeq == seq:
		return nil, nil
	}
	return reject, nil
}

// knownType is the problem of a submission of taskType when only the types
// pol names are accepted (only) and pol does not name it: an
// *events.InvalidError, rejected like any other invalid input. Intake and
// the submit API both check it.
func knownType(only bool, pol *policy.Snapshot, taskType string) error {
	if !only || pol.Names(taskType) {
		return nil
	}
	return &events.InvalidError{Problems: []string{fmt.Sprintf(
		`"type" %q is not a task type the policy names, and this mesh accepts no other (DISPATCH_KNOWN_TYPES_ONLY)`, taskType)}}
}

// firstRun is the run context of a new task's first attempt: REFINE, or a
// pipeline's first step. (A subject that keeps failing starts on PIVOT: the
// prompt builder decides that, from the history it reads anyway.)
func firstRun(t events.Task, pol *policy.Snapshot) events.Run {
	steps := pol.For(t.Type).Steps
	run := events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Step: ladder.FirstStep(steps)}
	if len(steps) > 0 {
		run.Rung = ""
	}
	return run
}
