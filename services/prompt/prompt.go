package prompt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// History is the outcome history the builder reads: the last outcomes and
// the last failures of (taskType, subject), oldest first. *history.Store
// implements it.
type History interface {
	Recent(ctx context.Context, taskType, subject string) (history.Record, error)
}

// DefaultHistoryN is how many previous outcomes a prompt carries by default.
const DefaultHistoryN = 5

// Service is the prompt builder.
type Service struct {
	cfg       Config
	templates templates
}

// New checks cfg and returns a prompt builder.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Service{cfg: cfg.withDefaults()}, nil
}

// Handle turns an admitted task into its prompt. A history that cannot be
// read, or a template that does not parse or execute, is a plain error: the
// router retries (the policy may be fixed meanwhile), then sends the message
// to review as poison. A task the history refuses outright (history.ErrInvalid)
// goes to review as poison at once.
func (s *Service) Handle(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var in events.Admitted
	if err := services.Decode(m, &in); err != nil {
		return nil, err
	}
	t := in.Task
	snap := s.cfg.Policy.Snapshot()
	pol := snap.For(t.Type)
	tmpl, err := s.templates.get(pol.Template)
	if err != nil {
		return nil, fmt.Errorf("prompt: task type %q: %w", t.Type, err)
	}
	// The last HistoryN outcomes go into the prompt; the recent failures
	// decide a new task's starting rung.
	kept, err := s.cfg.History.Recent(ctx, t.Type, t.Subject)
	if err != nil {
		return nil, s.historyError(ctx, t, err)
	}
	shown := s.cfg.HistoryN
	if pol.PreviousAttempts > 0 {
		shown = min(pol.PreviousAttempts, history.Keep)
	}
	previous := kept.Outcomes[max(0, len(kept.Outcomes)-shown):]
	if r := in.Run; r.Pass == 1 && r.Attempt == 1 && r.Rung == events.RungRefine && len(pol.Steps) == 0 {
		lad := s.cfg.Ladder
		if pol.RecurringFailures > 0 {
			lad.RecurringFailures = pol.RecurringFailures
		}
		if pol.RecurringWindow > 0 {
			lad.RecurringWindow = time.Duration(pol.RecurringWindow)
		}
		since := t.SubmittedAt.Add(-lad.Window())
		n := history.Failures(kept.Failures, since)
		if in.Run.Rung = lad.StartRung(n); in.Run.Rung == events.RungPivot {
			// PIVOT demands an approach not yet tried: those the subject's
			// recent failures tried are its dead ends.
			in.Run.DeadEnds = history.DeadEnds(kept.Failures, since)
			s.cfg.Log.Info("recurring failure: task starts on PIVOT", "task", t.ID, "failures", n, "dead_ends", len(in.Run.DeadEnds))
		}
	}
	data, deadEnds := fit(in.Base, previous, pol.PromptBudget, offersTools(pol, in.Run.Rung))
	msgs, err := Build(tmpl, data)
	if err != nil {
		return nil, fmt.Errorf("prompt: task type %q: %w", t.Type, err)
	}
	model := pol.Model
	if chain := pol.Chain(); len(chain) > 0 {
		model = chain[0].Model // the executor goes down the chain from it
	}
	if model == "" {
		model = s.cfg.DefaultModel
	}
	base := in.Base
	base.At, base.By, base.PolicyRev = s.cfg.Now().UTC(), s.cfg.Instance, snap.Rev
	if usesDeadEnds(base.Run.Rung) {
		// The dead ends the run carries on are those the prompt shows: the
		// recorder judges a PIVOT answer against these alone, so the model
		// is never refused for repeating what it was not shown.
		base.Run.DeadEnds = deadEnds
	}
	ev := events.Prompted{
		Base:   base,
		Prompt: events.Prompt{Model: model, Messages: msgs},
		Sealed: in.Sealed, // relayed: the prompt builder holds no key to change it
	}
	out, err := services.Next(base, events.StagePrompted, events.EventPrompted, ev)
	if err == nil && ev.Sealed != nil && len(out.Data) > MaxSealedEvent {
		// A large prompt goes without the seal, far from the server's
		// max_payload: the executor reads the state.
		ev.Sealed = nil
		out, err = services.Next(base, events.StagePrompted, events.EventPrompted, ev)
	}
	if err != nil {
		return nil, err
	}
	s.cfg.Log.Debug("prompt built", "task", t.ID, "type", t.Type, "pass", base.Run.Pass,
		"attempt", base.Run.Attempt, "rung", base.Run.Rung, "previous", len(previous), "model", model)
	return []services.Out{out}, nil
}

// MaxSealedEvent bounds a prompted event that carries the task's sealed
// state (events.Sealed): a larger one goes without it.
const MaxSealedEvent = 512 << 10

// historyError is what a history that cannot be read makes of the message:
// ctx's error at shutdown, poison for a task the history refuses outright
// (it will never be valid), else a plain error the router retries.
func (s *Service) historyError(ctx context.Context, t events.Task, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	err = fmt.Errorf("prompt: history of %s %q: %w", t.Type, t.Subject, err)
	if errors.Is(err, history.ErrInvalid) {
		return services.Dead(events.ReviewPoison, err)
	}
	return err
}
