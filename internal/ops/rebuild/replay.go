package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Unavailable is a policy revision events were decided under that the
// policy bucket does not hold.
type Unavailable struct {
	// Rev is the revision the events name; 0: they name none (recorded
	// before the policy lived in the bucket).
	Rev    uint64 `json:"rev"`
	Events int    `json:"events"`
	Error  string `json:"error"`
}

func (u Unavailable) String() string {
	return fmt.Sprintf("policy revision %d, named by %d events: %s", u.Rev, u.Events, u.Error)
}

// ErrPolicyUnavailable: events name policy revisions the bucket does not
// hold, and no fallback was given; a replay never guesses a policy.
var ErrPolicyUnavailable = errors.New("rebuild: the policy some events were decided under is not available")

// UnavailableError lists them.
type UnavailableError struct{ Revisions []Unavailable }

func (e *UnavailableError) Error() string {
	var b strings.Builder
	b.WriteString(ErrPolicyUnavailable.Error())
	for _, u := range e.Revisions {
		b.WriteString("\n  " + u.String())
	}
	b.WriteString("\n(recompute them with a policy of your choice: dispatch rebuild -policy FILE)")
	return b.String()
}

func (e *UnavailableError) Unwrap() error { return ErrPolicyUnavailable }

// Skipped is one stream message a replay could not decode.
type Skipped struct {
	Subject string `json:"subject"`
	Seq     uint64 `json:"seq"`
	Error   string `json:"error"`
}

func (s Skipped) String() string {
	return fmt.Sprintf("%s (seq %d): %s", s.Subject, s.Seq, s.Error)
}

// Options of a replay.
type Options struct {
	// Revisions are the policy's revisions in its bucket (policykv.History):
	// each event is recomputed with the revision it names
	// (events.Base.PolicyRev) — the recorder's decision on an attempt with
	// the revision of the recorder's own event. An event whose revision is
	// not there makes Replay fail with an *UnavailableError, unless
	// Fallback is set.
	Revisions *policykv.Revisions
	// Fallback recomputes the events whose revision Revisions does not
	// hold; they are listed in Stores.Fallbacks. Default: none, refuse.
	Fallback *policy.File
	// Policy, when set, is used for every event whatever revision it names:
	// a mesh that ran with a fixed policy (policy.Static: tests, embedding).
	Policy *policy.Source
	// Scoring must match the mesh's trust scoring.
	Scoring trust.Policy
}

// Replay reads every task event and review record on the stream, in order,
// and folds them into fresh stores. An event it cannot decode is skipped and
// listed in Stores.Skipped; only failing to read the stream is an error.
func Replay(ctx context.Context, js jetstream.JetStream, o Options) (*Stores, error) {
	if o.Policy == nil && o.Revisions == nil {
		return nil, errors.New("rebuild: no policy: set Options.Revisions (or Options.Policy)")
	}
	all, horizon, err := read(ctx, js)
	if err != nil {
		return nil, err
	}
	r := newReplayer(o)
	r.out.Events, r.out.Horizon = len(all), horizon
	r.replay(all)
	if len(r.missing) > 0 {
		var list []Unavailable
		for _, rev := range slices.Sorted(maps.Keys(r.missing)) {
			list = append(list, *r.missing[rev])
		}
		if o.Fallback == nil {
			return nil, &UnavailableError{Revisions: list}
		}
		r.out.Fallbacks = list
	}
	return r.out, nil
}

// Message is one stream message as a replay reads it.
type Message struct {
	Subject, MsgID string
	Data           []byte
	// Stored is when the stream stored it; Seq its stream sequence.
	Stored time.Time
	Seq    uint64
}

// Read reads every task event and review record on the stream, in order:
// what Replay folds, for another reader of the history (dispatch whatif).
// horizon is when the oldest message read was stored when the stream no
// longer holds its first ones (they aged out); zero when it holds them all.
func Read(ctx context.Context, js jetstream.JetStream) (msgs []Message, horizon time.Time, err error) {
	all, horizon, err := read(ctx, js)
	for _, m := range all {
		msgs = append(msgs, Message{Subject: m.subject, MsgID: m.msgID, Data: m.data, Stored: m.at, Seq: m.seq})
	}
	return msgs, horizon, err
}

func read(ctx context.Context, js jetstream.JetStream) ([]stored, time.Time, error) {
	cons, err := js.OrderedConsumer(ctx, events.Stream, jetstream.OrderedConsumerConfig{
		// Readers come and go (every page, every command): let the server
		// drop a forgotten consumer soon instead of after 5 minutes.
		InactiveThreshold: 10 * time.Second,
		FilterSubjects:    []string{events.TaskRoot + ".>", events.ReviewFilter},
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	var all []stored
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, time.Time{}, err
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				return nil, time.Time{}, err
			}
			all = append(all, stored{subject: msg.Subject(), data: msg.Data(), at: md.Timestamp.UTC(), seq: md.Sequence.Stream,
				msgID: msg.Headers().Get(jetstream.MsgIDHeader)})
		}
		if err := batch.Error(); err != nil {
			return nil, time.Time{}, err
		}
		if n == 0 {
			return nil, time.Time{}, fmt.Errorf("replay stalled with %d messages pending", pending)
		}
		pending -= uint64(n)
	}
	// Read after the replay: what aged out meanwhile is behind the horizon
	// too. A task submitted after it has every event on the stream (age
	// removes from the front).
	s, err := js.Stream(ctx, events.Stream)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("rebuild: stream %s: %w", events.Stream, err)
	}
	var horizon time.Time
	if st := s.CachedInfo().State; st.FirstSeq > 1 {
		horizon = st.FirstTime.UTC() // events before it are gone
	}
	return all, horizon, nil
}

func newReplayer(o Options) *replayer {
	return &replayer{o: o, requeues: map[string]events.Action{}, missing: map[uint64]*Unavailable{}, decidedBy: map[passKey]uint64{},
		held: map[passKey]services.HeldEntry{}, waits: map[passKey]services.HeldEntry{}, admitted: map[passKey]bool{},
		out: &Stores{
			Tasks: map[string]*events.TaskState{}, Trust: map[string]*trust.Stats{}, History: map[string]*history.Record{},
			Spend: map[[2]string]trust.DaySpend{},
		}}
}

// replay folds the stream messages all, in order, into r.out.
func (r *replayer) replay(all []stored) {
	for _, m := range all {
		r.recorderDecision(m)
	}
	for _, m := range all {
		if err := r.apply(m); err != nil {
			r.out.Skipped = append(r.out.Skipped, Skipped{Subject: m.subject, Seq: m.seq, Error: err.Error()})
		}
		r.out.replayed = max(r.out.replayed, m.seq)
	}
	r.out.Held = r.heldIndex()
}

// stored is one stream message.
type stored struct {
	subject, msgID string
	data           []byte
	at             time.Time
	seq            uint64
}

// passKey names one pass of one task.
type passKey struct {
	task string
	pass int
}

// recorderDecision notes the policy revision the recorder decided an
// attempt under: the one its event on that attempt names (succeeded, a
// retry it sent, escalated or stuck), which may be newer than the
// attempt's own executed event if the policy changed in between.
func (r *replayer) recorderDecision(m stored) {
	var b struct{ events.Base }
	pass := 0
	if reason, _, ok := events.ParseReviewSubject(m.subject); ok {
		var ev struct {
			events.Base
			Cause events.Cause `json:"cause"`
		}
		if (reason != events.ReviewEscalated && reason != events.ReviewStuck) || json.Unmarshal(m.data, &ev) != nil ||
			ev.Cause == events.CauseRungRate { // the gate's handoff
			return
		}
		b.Base, pass = ev.Base, ev.Run.Pass
	} else if _, stage, ok := events.ParseTaskSubject(m.subject); ok {
		if (stage != events.StageSucceeded && stage != events.StageRetry) || json.Unmarshal(m.data, &b) != nil {
			return
		}
		pass = b.Run.Pass
		if stage == events.StageRetry {
			// The recorder's retry opens the next pass under its own
			// Msg-Id; a human's requeue has another.
			if m.msgID != events.MsgID(b.Task.ID, b.Run.Pass, events.StageRetry) {
				return
			}
			pass--
		}
	} else {
		return
	}
	if _, seen := r.decidedBy[passKey{b.Task.ID, pass}]; !seen { // the first: a republish is deduplicated or the same
		r.decidedBy[passKey{b.Task.ID, pass}] = b.PolicyRev
	}
}

// policyFor is the policy of a task type under revision rev; an
// unavailable revision is counted (and recomputed with the fallback).
func (r *replayer) policyFor(rev uint64, taskType string) policy.Type {
	if r.o.Policy != nil {
		return r.o.Policy.For(taskType)
	}
	f, err := r.o.Revisions.At(rev)
	if err != nil {
		u := r.missing[rev]
		if u == nil {
			u = &Unavailable{Rev: rev, Error: err.Error()}
			r.missing[rev] = u
		}
		u.Events++
		return r.o.Fallback.For(taskType)
	}
	return f.For(taskType)
}

type replayer struct {
	o   Options
	out *Stores
	// missing are the policy revisions the bucket does not hold.
	missing map[uint64]*Unavailable
	// decidedBy is the policy revision the recorder decided each pass under.
	decidedBy map[passKey]uint64
	// requeues waits for the retry a requeue publishes after its action
	// record: a requeue whose retry never made it was undone (void).
	requeues map[string]events.Action
	// held is the entry the first held event for trust of each pass
	// implies, waits the one its first held event waiting for canaries
	// does; admitted the passes the gate let through.
	held, waits map[passKey]services.HeldEntry
	admitted    map[passKey]bool
}

func (r *replayer) task(id string) *events.TaskState {
	st := r.out.Tasks[id]
	if st == nil {
		st = &events.TaskState{ID: id}
		r.out.Tasks[id] = st
	}
	return st
}

func (r *replayer) stats(taskType string) *trust.Stats {
	s := r.out.Trust[taskType]
	if s == nil {
		s = &trust.Stats{Type: taskType}
		r.out.Trust[taskType] = s
	}
	return s
}

// fold runs a transition of package task on a task's replayed state, as
// the services run it on the stored one; a task the replay has not seen
// yet starts from its id alone.
func (r *replayer) fold(id string, tr func(st events.TaskState, found bool) (events.TaskState, task.Cause)) task.Cause {
	st := r.task(id)
	next, c := tr(*st, true)
	if c.Changed() {
		*st = next
	}
	return c
}

func (r *replayer) apply(m stored) error {
	subject, data := m.subject, m.data
	if reason, _, ok := events.ParseReviewSubject(subject); ok {
		return r.review(reason, data)
	}
	_, stage, ok := events.ParseTaskSubject(subject)
	if !ok {
		return nil
	}
	switch stage {
	case events.StageQueued, events.StageVerified:
		// A task's first event: queued, or verified for a type without a
		// verifier (intake sends it to the gate at once). Either created
		// its state; a later one changes nothing rebuild keeps.
		var ev events.Queued
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		if _, exists := r.out.Tasks[ev.Task.ID]; exists {
			return nil
		}
		st := task.Queued(ev.Task, ev.Run, 0)
		r.out.Tasks[ev.Task.ID] = &st
	case events.StageRetry:
		var ev events.Retry
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		if a, ok := r.requeues[ev.Task.ID]; ok && ev.Run.Reviewed {
			delete(r.requeues, ev.Task.ID)
			st := r.task(ev.Task.ID)
			*st = task.Act(*st, a)
		}
	case events.StageCancelled:
		var ev events.Cancelled
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		r.fold(ev.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Cancel(st, found, ev.Base, ev.Verification)
		})
	case events.StageAdmitted:
		var ev events.Admitted
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		r.gate(ev.Base, ev.Trust)
		r.admitted[passKey{ev.Task.ID, ev.Run.Pass}] = true
	case events.StageHeld:
		var ev events.Held
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		if ev.Hold != events.HoldTrust {
			// Waiting for canaries: neither the state nor the streak
			// changes; the pass sleeps in the held index until it goes.
			if p := (passKey{ev.Task.ID, ev.Run.Pass}); !hasKey(r.waits, p) {
				r.waits[p] = services.HeldEntryOf(ev, m.seq, ev.Hold, ev.Run.Rung)
			}
			return nil
		}
		r.gate(ev.Base, ev.Trust)
		r.fold(ev.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Hold(st, found, ev.Base, ev.Reason)
		})
		if p := (passKey{ev.Task.ID, ev.Run.Pass}); !hasKey(r.held, p) {
			r.held[p] = services.HeldEntryOf(ev, m.seq, events.HoldTrust, "")
		}
	case events.StageExecuted:
		var ev events.Executed
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		r.executed(ev, m.at)
	}
	// A wake (events.StageWake) is the gate's sweeper republishing a held
	// event for another look: a look, no decision. It changes no store.
	return nil
}

func hasKey[K comparable, V any](m map[K]V, k K) bool {
	_, ok := m[k]
	return ok
}

// heldIndex is the held index the replayed tasks imply: one entry per task
// held back at the pass it is at, as the gate's look at that pass's held
// event put it to sleep (services.HeldEntry: Since its time, Seq its
// stream sequence). A task held for its type's trust has the entry of its
// pass's held event for trust; a task waiting for its type's canaries —
// its state unchanged, neither ended nor held — that of its held event
// waiting for them. A pass the gate admitted has none, though the
// replayed state still shows it held (or verified) until its attempt is
// recorded (the executor's running is in no event); the gate removed the
// entry when its look admitted it. Any other status has none: the gate
// removes the entry of a pass that stopped, ended or moved on.
func (r *replayer) heldIndex() map[string]*services.HeldEntry {
	out := map[string]*services.HeldEntry{}
	for id, st := range r.out.Tasks {
		p := passKey{id, st.Pass}
		if r.admitted[p] || events.Terminal(st.Status) {
			continue
		}
		e, ok := r.held[p]
		if st.Status != events.StatusHeld {
			e, ok = r.waits[p]
		}
		if ok {
			out[e.Key()] = &e
		}
	}
	return out
}

func (r *replayer) review(reason string, data []byte) error {
	switch reason {
	case events.ReviewGated:
		var ev events.Gated
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		r.gate(ev.Base, ev.Trust)
		r.fold(ev.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Block(st, found, ev.Base, ev.Reason, ev.Trust.Cause)
		})
		if ev.Run.Attempt > 1 { // a retry stopped: the gate's end marker
			s := r.stats(ev.Task.Type)
			s.Outcomes, _ = trust.Insert(s.Outcomes, trust.EndMarker(ev.Task.ID, ev.Run.Pass, ev.At), trust.Keep)
		}
	case events.ReviewEscalated:
		var ev events.Escalated
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		if ev.Cause != events.CauseRungRate {
			return nil // the recorder's handoffs are replayed from their attempts
		}
		r.fold(ev.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.HandOff(st, found, ev.Base, ev.Reason)
		})
		s := r.stats(ev.Task.Type) // the gate's mark that the task ended (trust.EndMarker)
		s.Outcomes, _ = trust.Insert(s.Outcomes, trust.EndMarker(ev.Task.ID, ev.Run.Pass, ev.At), trust.Keep)
	case events.ReviewAction:
		var a events.Action
		if err := json.Unmarshal(data, &a); err != nil {
			return err
		}
		st, ok := r.out.Tasks[a.TaskID]
		switch {
		case !ok: // input that never became a task
		case a.Action == events.ActionRequeue:
			r.requeues[a.TaskID] = a // applied when its retry shows up
		default:
			*st = task.Act(*st, a)
		}
	}
	return nil
}

// gate mirrors the gate's writes to its type's gate facts: the block
// streak and the remembered decisions (trust.Policy.Gate). Its canary
// places are not mirrored (see Stores.Trust).
func (r *replayer) gate(b events.Base, d events.TrustDecision) {
	st, ok := r.out.Tasks[b.Task.ID]
	step, below := trust.StreakStep(d.Cause, d.Probe, b.Run.Attempt, ok && task.Held(*st, b.Run.Pass))
	if step {
		r.out.stepOf(b, d, below)
	}
	s := r.stats(b.Task.Type)
	if !step || (!below && s.BlockStreak == 0) {
		return
	}
	scoring := r.policyFor(b.PolicyRev, b.Task.Type).Scoring(r.o.Scoring).WithDefaults() // its probe_after
	next, _, _ := scoring.Gate(*s, events.MsgID(b.Task.ID, b.Run.Pass, "gate"), below)
	*s = next
}

// executed mirrors the executor's and the recorder's writes for one
// attempt: the task state, its entry in the subject's history record (when
// it counts for history), and
// what the recorder publishes for it — its trust outcome when it counts,
// its spend.
func (r *replayer) executed(ev events.Executed, stored time.Time) {
	b, t := ev.Base, ev.Task
	r.fold(t.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.Executed(st, found, b, ev.Result)
	})
	st := r.task(t.ID)
	rev, ok := r.decidedBy[passKey{t.ID, b.Run.Pass}]
	if !ok {
		rev = b.PolicyRev // not decided yet (or its event is lost): the executor's
	}
	pol := r.policyFor(rev, t.Type)
	next, res, c := task.Record(*st, true, b, ev.Result, pol, stored)
	if !c.Changed() {
		return // already recorded; or, as the recorder, an old pass or a task a human cancelled meanwhile
	}
	key := events.MsgID(t.ID, b.Run.Pass, "outcome")
	if task.CountsForHistory(res) {
		hk := history.Key(t.Type, t.Subject)
		rec := r.out.History[hk]
		if rec == nil {
			rec = &history.Record{Type: t.Type, Subject: t.Subject}
			r.out.History[hk] = rec
		}
		*rec, _ = rec.Add(history.Entry{
			Key: key, TaskID: t.ID, Attempt: b.Run.Attempt, Rung: b.Run.Rung, Step: b.Run.Step,
			Outcome: res.Outcome, Approach: res.Approach, Summary: res.Summary, Error: res.Error, At: stored,
		})
	}
	if tokens, cost := task.DailySpend(res, pol.DailyBudget); tokens != 0 || cost != 0 {
		k := [2]string{t.Type, trust.Day(stored)}
		d := r.out.Spend[k]
		d.Type, d.Day = k[0], k[1]
		d.Tokens += int64(tokens)
		d.NanoUSD += trust.NanoUSD(cost)
		r.out.Spend[k] = d
	}
	if task.CountsForTrust(res) {
		s := r.stats(t.Type)
		s.Outcomes, _ = trust.Insert(s.Outcomes, task.TrustOutcome(key, next, b.Run, res, stored), trust.Keep)
	}
	*st = next
}
