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
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"dispatchmesh/events"
	"dispatchmesh/internal/policy"
	"dispatchmesh/internal/task"
	"dispatchmesh/services"
)

// Config configures a Service. The zero value works: types without a
// verifier are skipped, and http and command verifiers need nothing more.
type Config struct {
	// NC is the connection nats verifiers are asked on. Default nil: a type
	// with a nats verifier then gets a verifier error (ErrNoConn).
	NC *nats.Conn
	// HTTPClient sends http verifiers' requests. Default http.DefaultClient;
	// each check is bounded by its verifier's timeout either way.
	HTTPClient *http.Client
	// Policy gives each type's verifier. Default nil: built-in defaults (none).
	Policy *policy.Source
	// Tasks, when set, gets status verifying before a check and cancelled
	// for a cancelled task. Default nil: task state is left alone.
	Tasks *services.TaskStore
	// Registry receives the task metrics (a cancelled task is counted as
	// dispatch_tasks_finished_total{status="cancelled"}). Default: none.
	Registry prometheus.Registerer
	// Instance names this instance in the events' by field.
	// Default "verifier@<hostname>:<pid>".
	Instance string
	// Log receives the service's logs. Default slog.Default().
	Log *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Service is the verifier stage.
type Service struct {
	metrics  *services.TaskMetrics
	nc       *nats.Conn
	http     *http.Client
	policy   *policy.Source
	tasks    *services.TaskStore
	instance string
	log      *slog.Logger
	now      func() time.Time
	kinds    map[string]factory
}

// New builds a Service. It fails when the current policy is invalid or names
// a nats verifier while cfg.NC is nil.
func New(cfg Config) (*Service, error) {
	s := &Service{
		nc: cfg.NC, http: cfg.HTTPClient, policy: cfg.Policy, tasks: cfg.Tasks,
		instance: cfg.Instance, log: cfg.Log, now: cfg.Now, metrics: services.NewTaskMetrics(cfg.Registry),
	}
	if s.instance == "" {
		host, _ := os.Hostname()
		s.instance = fmt.Sprintf("verifier@%s:%d", host, os.Getpid())
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.kinds = s.registry()
	if err := s.checkPolicy(cfg.Policy.File()); err != nil {
		return nil, fmt.Errorf("verifier: %w", err)
	}
	return s, nil
}

// checkPolicy reports every problem of f that would make checks fail.
func (s *Service) checkPolicy(f *policy.File) error {
	if f == nil {
		return nil
	}
	errs := []error{f.Validate()}
	check := func(where string, t policy.Type) {
		if t.Verifier != nil && t.Verifier.Kind == policy.VerifierNATS && s.nc == nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, ErrNoConn))
		}
	}
	check("defaults", f.Defaults)
	for name, t := range f.Types {
		check("types."+name, t)
	}
	return errors.Join(errs...)
}

// input is a queued or a retry event: both carry Base, retry adds Reason and,
// for a parked task, WakeAt.
type input struct {
	events.Base
	Reason string    `json:"reason"`
	WakeAt time.Time `json:"wake_at,omitzero"`
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
	now := s.now().UTC()
	if wait := in.WakeAt.Sub(now); wait > 0 {
		// A parked task: hold it (a delayed nak) until it is due.
		return nil, services.Snooze(wait, fmt.Errorf("task %s parked until %s", b.Task.ID, in.WakeAt.Format(time.RFC3339)))
	}
	pol := s.policy.Snapshot()
	b.At, b.By, b.PolicyRev = now, s.instance, pol.Rev
	pv := *pol.For(b.Task.Type).Verifier
	log := s.log.With("task", b.Task.ID, "type", b.Task.Type, "pass", b.Run.Pass, "verifier", kind(pv))
	log.Debug("verifying", "reason", in.Reason)
	if s.tasks != nil && (kind(pv) != policy.VerifierNone || m.Delivered > 1) {
		// A task that ended is not verified again — unless this verifier
		// ended it (stale) and this is a redelivery: then its cancelled
		// event is published again below (the Msg-Id deduplicates). With
		// no verifier there is nothing to save by reading the state first:
		// a task a human cancelled is skipped where it would cost, by the
		// executor.
		ended, st, err := s.tasks.Ended(ctx, b.Task.ID)
		if err != nil {
			return nil, s.fail(ctx, fmt.Errorf("read task state: %w", err))
		}
		if ended && st.Pass >= b.Run.Pass && (st.Status != events.StatusCancelled || task.EndedByHuman(st)) {
			log.Info("task has ended: not verified", "status", st.Status)
			return nil, nil
		}
	}

	if kind(pv) != policy.VerifierNone && s.tasks != nil {
		if _, _, err := s.tasks.Apply(ctx, b.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Verifying(st, found, b)
		}); err != nil {
			return nil, s.fail(ctx, fmt.Errorf("set status verifying: %w", err))
		}
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
		return outs(services.Next(b, events.StageVerified, events.EventVerified, events.Verified{Base: b, Verification: v}))
	case v.Verdict == events.VerdictStale:
		log.Info("task is stale; cancelled", "detail", v.Detail)
		return s.cancel(ctx, b, v)
	default: // verdict error, fail-closed
		return s.cancel(ctx, b, v)
	}
}

// check runs pv's checker on t. A checker answering something other than
// exists, stale or skipped is an error.
func (s *Service) check(ctx context.Context, t events.Task, pv policy.Verifier) (events.Verification, error) {
	c, err := s.CheckerFor(pv)
	if err != nil {
		return events.Verification{}, err
	}
	v, err := c.Check(ctx, t)
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
	if s.tasks != nil {
		_, cause, err := s.tasks.Apply(ctx, b.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Cancel(st, found, b, v)
		})
		if err != nil {
			return nil, s.fail(ctx, fmt.Errorf("set status cancelled: %w", err))
		}
		if cause.Changed() {
			s.metrics.Finish(b.Task.Type, events.StatusCancelled, b.At.Sub(b.Task.SubmittedAt))
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
