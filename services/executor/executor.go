package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Executor kinds (policy executor) and step kinds (policy steps' run).
const (
	ExecutorModel   = "model"
	ExecutorCommand = "command"
)

// Service is the executor stage.
type Service struct {
	cfg     Config
	rules   Rules
	ledger  ledger
	models  *modelStates // circuits and dead marks, shared by every instance
	metrics *metrics
	flights flights // the attempts running here, which a cancel ends (cancel.go)

	dialMu sync.Mutex
	dialed map[string]Model // the models of chain entries, by endpoint and key

	streamMu   sync.Mutex
	taskStream jetstream.Stream // bound on the first redelivery (executed)
}

// New validates cfg and returns the service.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, rules: cfg.Rules, metrics: newMetrics(cfg.Registry, cfg.TypeLabels, cfg.modelLabels(), cfg.routeLabels())}
	if s.rules.Now == nil {
		s.rules.Now = cfg.Now
	}
	s.models = &modelStates{cfg: cfg.Circuit.withDefaults(), store: &memStore{}, log: cfg.Log}
	if cfg.ModelStates != nil {
		ctx, cancel := context.WithTimeout(context.Background(), watchTimeout)
		store, err := newKVStore(ctx, cfg.ModelStates, cfg.Log)
		cancel()
		if err != nil {
			return nil, err
		}
		s.models.store = store
	}
	if cfg.Tasks != nil {
		s.ledger = kvLedger{tasks: cfg.Tasks, log: cfg.Log}
		if cfg.NATS != nil {
			if err := s.listenForCancels(cfg.NATS); err != nil {
				s.models.store.close()
				return nil, err
			}
		}
	} else {
		s.ledger = &memLedger{}
	}
	return s, nil
}

// watchTimeout bounds reading the model states' bucket at start.
const watchTimeout = 30 * time.Second

// Close releases what the service keeps between messages (the watches of
// the tasks in flight and of the model states). Call it once no Handle
// runs.
func (s *Service) Close() {
	s.flights.close()
	s.models.store.close()
}

// Handle runs one prompted task — through the model, the type's agent
// command, or the pipeline step's command — and returns its Executed event.
//
// It returns an error instead when the prompt is not an attempt: ctx.Err()
// on shutdown (the message is redelivered), a *services.SnoozeError for a
// transient failure within the type's transient budget, while the
// endpoint's circuit is open, or while a tool does not answer within the
// type's tool wait (redelivered after the delay, no Executed; a tool loop
// cut short is kept and resumed),
// a poison DeadError for input that cannot be executed, and a plain error
// when the task state cannot be read or written. A request identical to one
// that already failed deterministically for the task is not sent: its
// Executed says so (ErrorClassRefused).
func (s *Service) Handle(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	var in events.Prompted
	if err := services.Decode(m, &in); err != nil {
		return nil, err
	}
	if !events.ValidID(in.Task.ID) {
		return nil, services.Dead(events.ReviewPoison, fmt.Errorf("prompted event has an invalid task id %q", in.Task.ID))
	}
	snap := s.cfg.Policy.Snapshot()
	pol := snap.For(in.Task.Type)
	step, isStep := commandStep(pol, in.Run.Step)
	if !isStep && len(in.Prompt.Messages) == 0 {
		return nil, services.Dead(events.ReviewPoison, fmt.Errorf("prompted event of task %s has no messages", in.Task.ID))
	}
	base := in.Base
	base.By, base.PolicyRev = s.cfg.Instance, snap.Rev
	base.At = s.cfg.Now()
	// A human may cancel the task while the model works on it: the call's
	// context ends, and the attempt is neither recorded nor retried.
	ctx, ended, done := s.flights.track(ctx, in.Task.ID)
	defer done()
	// The attempt's first write starts from the state as the last service
	// that wrote it sealed it, instead of reading it. A redelivery's seal
	// is most likely stale (its first delivery wrote): it reads.
	k := &known{}
	if s.cfg.Tasks != nil && m.Delivered == 1 {
		k.at = s.cfg.Tasks.Open(in.Task.ID, in.Sealed)
	}
	f, skip, err := s.ledger.begin(ctx, base, k)
	if err != nil || skip {
		return nil, err
	}
	if m.Delivered > 1 {
		// A redelivery. Its first delivery may have ended the attempt: its
		// Executed stored and the ack lost (nothing to do: calling again
		// would pay twice), or not stored (the publish failed, the process
		// died) after a request of this pass failed deterministically —
		// that request is not sent again: the attempt fails again with the
		// class it failed with (failedAgain), a later request of its tool
		// loop is refused.
		done, err := s.executed(ctx, base)
		if err != nil || done {
			return nil, err
		}
		f.redelivered = true
		if f.failed == nil {
			f.failed = map[string]bool{}
		}
		for hash := range f.bannedNow {
			f.failed[hash] = true
		}
	}

	a := &attempt{s: s, in: in, base: base, pol: pol, f: f, known: k, banned: map[string]string{}}
	start := s.cfg.Now()
	result, err := s.execute(ctx, a, step, isStep)
	if ended() {
		// The call was cut short by a cancel heard on the wire: only a
		// task whose state did end is dropped. A cancel that did not take
		// (its record failed and the state was put back) or a forged one
		// must not strand a running task: the message is tried again.
		// Either way what the attempt spent is kept (abandon).
		st, gerr := s.abandon(ctx, a)
		if gerr != nil || !events.Terminal(st.Status) {
			return nil, fmt.Errorf("task %s: call cut short by a cancel that the task state does not show (%v); trying again", in.Task.ID, gerr)
		}
		s.cfg.Log.Info("task cancelled during its attempt: call abandoned, nothing recorded", "task", in.Task.ID, "pass", in.Run.Pass, "attempt", in.Run.Attempt)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	end := s.cfg.Now()
	result.DurationMS = end.Sub(start).Milliseconds()
	// The answer is paid for: its text is capped so that its Executed can
	// always be stored (an event over max_payload would be redelivered,
	// and the model paid again, until the message went to review).
	result = capResult(result, answerCaps)
	s.logCall(in, result)

	base.At = end
	out, err := executedOut(events.Executed{Base: base, Result: result, State: k.state()})
	if err != nil {
		return nil, err
	}
	return []services.Out{out}, nil
}

// execute runs the attempt as its policy says: a command step of a
// pipeline, an agent's command, or a call to the model.
func (s *Service) execute(ctx context.Context, a *attempt, step policy.Step, isStep bool) (events.Result, error) {
	switch {
	case isStep:
		result, err := traced(ctx, func(ctx context.Context) (events.Result, error) { return s.runStep(ctx, a.in, step) })
		// A command step spends nothing, but its Result is the one the
		// recorder records: it bills what earlier tries left unbilled.
		result.TokensIn, result.TokensOut, result.Cost = a.f.unbilled.TokensIn, a.f.unbilled.TokensOut, a.f.unbilled.Cost
		return result, err
	case a.pol.Executor == ExecutorCommand:
		return traced(ctx, func(ctx context.Context) (events.Result, error) { return s.runAgent(ctx, a) })
	case a.pol.Executor == "" || a.pol.Executor == ExecutorModel:
		return s.runModel(ctx, a)
	default:
		return events.Result{Outcome: events.OutcomeFailure, ErrorClass: events.ErrorClassDeterministic,
			Error: fmt.Sprintf("policy of type %q: unknown executor %q (model, command)", a.in.Task.Type, a.pol.Executor)}, nil
	}
}

// executedOut is the attempt's Executed event as it is published: cut
// until it fits, its answer never lost; one that cannot fit the stream is
// poison.
func executedOut(ev events.Executed) (services.Out, error) {
	base := ev.Base
	out, err := services.Next(base, events.StageExecuted, events.EventExecuted, ev)
	if err == nil && ev.State != nil && len(out.Data) > MaxCarried {
		// A large task (its payload, a long history) goes without its
		// state: the recorder reads it.
		ev.State = nil
		out, err = services.Next(base, events.StageExecuted, events.EventExecuted, ev)
	}
	if err == nil && len(out.Data) > MaxExecuted {
		// What else the event holds (the task's payload, the run) leaves
		// the answer little room: it is cut tighter, never lost.
		ev.Result = capResult(ev.Result, tightCaps)
		out, err = services.Next(base, events.StageExecuted, events.EventExecuted, ev)
	}
	if err == nil && len(out.Data) > MaxExecuted {
		// Still too large: the run's dead ends (32 of 4 KiB, each byte of
		// <, > or & escaped as 6) are cut too — the ones before this
		// attempt, kept whole in their own attempts' events.
		ev.Run.DeadEnds = cutDeadEnds(ev.Run.DeadEnds)
		out, err = services.Next(base, events.StageExecuted, events.EventExecuted, ev)
	}
	if err != nil {
		return services.Out{}, err
	}
	if len(out.Data) > services.MaxEventSize-headerRoom {
		// Nothing more to cut: storing it would fail on every redelivery,
		// and each would pay the model again. One call, then a human.
		return services.Out{}, &services.DeadError{Reason: events.ReviewPoison, Err: fmt.Errorf(
			"the executed event is %d bytes even with its answer and dead ends cut, over the stream's %d", len(out.Data), services.MaxEventSize)}
	}
	return out, nil
}

// headerRoom is what an event's headers may take of the stream's
// MaxEventSize (they count toward it and toward max_payload).
const headerRoom = 4 << 10

// cutDeadEnds cuts each dead end's approach and reason to 256 bytes.
func cutDeadEnds(des []events.DeadEnd) []events.DeadEnd {
	out := slices.Clone(des)
	for i := range out {
		out[i].Approach, out[i].Reason = textcut.Cut(out[i].Approach, 256), textcut.Cut(out[i].Reason, 256)
	}
	return out
}

// MaxCarried bounds an Executed event that carries the task's state
// (events.StateAt): a larger one goes without it, far from the servers'
// max_payload (1 MB).
const MaxCarried = 256 << 10

// MaxExecuted bounds an Executed event whose answer has its usual caps
// (events.MaxApproach …): past it the answer's text is cut tighter (512
// bytes of approach, 1 KiB of summary and of error, 8 changes of 128
// bytes), still short of the servers' max_payload (1 MB).
const MaxExecuted = 768 << 10

// executed reports whether the stream already holds this pass's Executed
// event. It is asked on a redelivery only, never on the hot path. When it
// cannot tell, the error is the redelivery's: it is tried again later
// rather than paying for a call whose answer may be stored already.
func (s *Service) executed(ctx context.Context, b events.Base) (bool, error) {
	if s.cfg.NATS == nil {
		return false, nil
	}
	stream, err := s.stream(ctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, nil // no stream, no Executed (an executor run without the mesh's stream)
	}
	if err != nil {
		return false, fmt.Errorf("executor: is pass %d of %s executed: %w", b.Run.Pass, b.Task.ID, err)
	}
	raw, err := stream.GetLastMsgForSubject(ctx, events.TaskSubject(b.Task.ID, events.StageExecuted))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("executor: is pass %d of %s executed: %w", b.Run.Pass, b.Task.ID, err)
	}
	var prev events.Executed
	return json.Unmarshal(raw.Data, &prev) == nil && prev.Run.Pass == b.Run.Pass, nil
}

// stream is the task stream, bound on first use.
func (s *Service) stream(ctx context.Context) (jetstream.Stream, error) {
	s.streamMu.Lock()
	defer s.streamMu.Unlock()
	if s.taskStream != nil {
		return s.taskStream, nil
	}
	js, err := jetstream.New(s.cfg.NATS)
	if err != nil {
		return nil, err
	}
	stream, err := js.Stream(ctx, services.Stream)
	if err != nil {
		return nil, err
	}
	s.taskStream = stream
	return stream, nil
}

// runModel asks the model — the first of the type's chain that takes the
// call — with the type's tools when it has any.
func (s *Service) runModel(ctx context.Context, a *attempt) (events.Result, error) {
	tools := toolsFor(a.pol, a.in.Run)
	if len(tools) > 0 && s.cfg.NATS == nil {
		s.cfg.Log.Warn("tools configured but no NATS connection: none are offered", "task", a.in.Task.ID, "type", a.in.Task.Type)
		tools = nil
	}
	req := Request{
		Messages:       PromptMessages(a.in.Prompt.Messages),
		ResponseFormat: ResponseFormatJSON,
		Tools:          toolSpecs(tools),
		TaskType:       a.in.Task.Type,
		TaskID:         a.in.Task.ID,
		Attempt:        a.in.Run.Attempt,
	}
	a.routes = s.routes(a)
	first := &a.routes[0]
	a.endpoint, a.model, a.prompt = first.endpoint, first.model, len(req.Messages)
	if r := a.f.resume; r != nil {
		// A try of this attempt was cut short: go on from its turns.
		req.Messages = append(req.Messages, messagesOf(r.Turns)...)
		for hash := range a.f.bannedNow {
			if strings.HasPrefix(hash, ToolHashPrefix) {
				a.banned[hash] = "it failed earlier in this attempt; its error is in the conversation above"
			}
		}
	}
	// A redelivered pass whose request failed on its first delivery fails
	// as it did — unless that was the deployment's fault on a model of a
	// chain, which the call then passes over (complete).
	hashes := make([]string, len(a.routes))
	refused := true
	for i, rt := range a.routes {
		r := req
		r.Model, r.Endpoint = rt.model, rt.identity
		hashes[i] = RequestHash(r)
		refused = refused && a.f.failed[hashes[i]]
	}
	if class, ok := a.f.bannedNow[hashes[0]]; ok && a.f.redelivered && (len(a.routes) == 1 || !events.DeploymentFault(class)) {
		return s.failedAgain(ctx, a, hashes[0], class)
	}
	if refused {
		return s.refuse(ctx, a, hashes[0], a.f.unbilled)
	}
	return s.conclude(ctx, a, a.converse(ctx, req, tools))
}

// modelFor picks the model of a type without a chain: the prompt's, then
// the type's policy, then the default.
func (s *Service) modelFor(in events.Prompted, pol policy.Type) string {
	if in.Prompt.Model != "" {
		return in.Prompt.Model
	}
	if pol.Model != "" {
		return pol.Model
	}
	return s.cfg.DefaultModel
}

// endpoint names the configured model's endpoint.
func (s *Service) endpoint() string {
	if e, ok := s.cfg.Model.(Endpointer); ok {
		return e.Endpoint()
	}
	return fmt.Sprintf("%T", s.cfg.Model)
}

// refuse is the Result of a request that was not sent. It bills spent, what
// the attempt's calls spent before it (its earlier tries' unbilled spend and
// this try's answered turns): the ledger settles the unbilled part here.
func (s *Service) refuse(ctx context.Context, a *attempt, hash string, spent events.Usage) (events.Result, error) {
	counted, err := s.ledger.addRefused(ctx, a.base, a.known)
	if err != nil {
		return events.Result{}, err
	}
	if err := s.settle(ctx, a); err != nil {
		return events.Result{}, err
	}
	if counted { // once per pass, as the task's state counts it
		s.metrics.refused.WithLabelValues(s.metrics.typ(a.in.Task.Type)).Inc()
	}
	return events.Result{
		Outcome: events.OutcomeFailure, ErrorClass: events.ErrorClassRefused, Refused: true,
		RequestHash: hash, Model: a.model, TransientRetries: a.f.transient,
		TokensIn: spent.TokensIn, TokensOut: spent.TokensOut, Cost: spent.Cost,
		Error: fmt.Sprintf("refused: identical to a request that already failed deterministically (%s); the request must change", HashPrefix(hash)),
	}, nil
}

// failedAgain is the Result of a redelivered pass whose request already
// failed, with class, when the pass was first delivered, and whose outcome
// was lost with that delivery: the request is not sent again, and the
// attempt fails as it did (an auth or quota failure still goes straight to
// a human). It bills what the attempt's earlier tries spent.
func (s *Service) failedAgain(ctx context.Context, a *attempt, hash string, class events.ErrorClass) (events.Result, error) {
	if err := s.settle(ctx, a); err != nil {
		return events.Result{}, err
	}
	s.metrics.errors.WithLabelValues(s.metrics.typ(a.in.Task.Type), string(class)).Inc()
	spent := a.f.unbilled
	return events.Result{
		Outcome: events.OutcomeFailure, ErrorClass: class, RequestHash: hash, Model: a.model, TransientRetries: a.f.transient,
		TokensIn: spent.TokensIn, TokensOut: spent.TokensOut, Cost: spent.Cost,
		Error: fmt.Sprintf("%s: this request (%s) failed so when this pass was first delivered, and that outcome was lost; it is not sent again", class, HashPrefix(hash)),
	}, nil
}

// settle ends the attempt's run of transient failures and its cut-short
// tool loop (task.Settle: in the task's state its unbilled spend is billed
// when its Result is recorded).
func (s *Service) settle(ctx context.Context, a *attempt) error {
	if a.f.transient == 0 && a.f.unbilled == (events.Usage{}) && a.f.resume == nil {
		return nil
	}
	return s.ledger.settle(ctx, a.base, a.known)
}

// cost prices an answer by the requested model, else the answering one; the
// simulated model's answers cost nothing.
func (s *Service) cost(requested string, resp Response) float64 {
	if resp.Simulated {
		return 0
	}
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
		"task", in.Task.ID, "type", in.Task.Type, "pass", in.Run.Pass, "attempt", in.Run.Attempt, "step", in.Run.Step,
		"model", r.Model, "tokens_in", r.TokensIn, "tokens_out", r.TokensOut, "cost", r.Cost,
		"duration_ms", r.DurationMS, "outcome", r.Outcome,
	}
	if r.ToolCalls > 0 {
		attrs = append(attrs, "tool_calls", r.ToolCalls, "tool_refusals", r.ToolRefusals)
	}
	if r.Outcome == events.OutcomeSuccess {
		s.cfg.Log.Info("model call", attrs...)
		return
	}
	s.cfg.Log.Warn("model call", append(attrs, "error_class", r.ErrorClass, "error", r.Error)...)
}

// errorText is the error as the next prompt should see it: everything the
// provider said for a provider error.
func errorText(err error) string {
	var pe *ProviderError
	if errors.As(err, &pe) {
		return pe.Detail()
	}
	return err.Error()
}
