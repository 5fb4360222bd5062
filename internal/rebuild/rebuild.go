// Package rebuild recomputes the derived stores — task state, each type's
// trust (its outcomes on the outcome stream, the gate's facts in the trust
// bucket), each subject's outcome history (the history bucket), the spend
// counters, the gate's held index (the held bucket) — from the event stream
// alone, with the same pure functions the services use, and compares them
// with the live stores. After a normal run they agree; a difference means a
// store was written outside the events (or lost), and Apply can restore it
// from the stream.
package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/kvcas"
	"github.com/dispatchmesh/dispatchmesh/internal/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/task"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Stores are what a replay produces.
type Stores struct {
	Tasks map[string]*events.TaskState
	// Trust is each type's trust as its events imply it: its outcomes,
	// oldest first — the newest trust.Keep by (At, Key), what the outcome
	// stream keeps of the type — and the gate's facts: block streak and
	// remembered gate decisions. Canary places are not among them: the gate
	// gives a place back when it finds its holder ended, which no event
	// records; they are the gate's live admission control (bounded by their
	// TTL), never rebuilt.
	Trust map[string]*trust.Stats
	// History is each (type, subject)'s record by history.Key: its newest
	// outcomes and failures by (At, Key), history.Keep of each, built with
	// history.Record.Add as the recorder's history.Store.Append builds the
	// record it stores in the history bucket.
	History map[string]*history.Record
	// Spend is what each (type, UTC day) spent: the spend counters.
	Spend map[[2]string]trust.DaySpend
	// Held is the gate's held index by services.HeldEntry.Key: an entry
	// for each task held for its type's trust (status held) at its pass,
	// built from the pass's first held event (see heldIndex).
	Held map[string]*services.HeldEntry
	// Events is how many stream messages were replayed.
	Events int
	// Skipped are the events that could not be decoded: reported and left
	// out, the rest of the stream replayed. The mesh could not decode them
	// either (their service dead-lettered them), so it never applied them.
	Skipped []Skipped
	// Fallbacks are the policy revisions events named that the bucket does
	// not hold, recomputed with Options.Fallback instead.
	Fallbacks []Unavailable
	// Horizon is when the oldest event replayed was stored, when the stream
	// no longer holds its first events (they aged out: DISPATCH_MAX_AGE);
	// zero when it holds them all. What the live stores know from before it
	// — a task created earlier, a history entry, an outcome, a day's spend
	// — no replay can say: Compare and Apply take it as the live stores
	// hold it (keepBeforeHorizon).
	Horizon time.Time
	// replayed is the stream sequence of the last message replayed: a held
	// entry naming a later one is the gate's news, which the replay cannot
	// judge (keepAfterReplay).
	replayed uint64
}

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
	// Revisions are the policy's revisions in its bucket (policy.History):
	// each event is recomputed with the revision it names
	// (events.Base.PolicyRev) — the recorder's decision on an attempt with
	// the revision of the recorder's own event. An event whose revision is
	// not there makes Replay fail with an *UnavailableError, unless
	// Fallback is set.
	Revisions *policy.Revisions
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
	r := newReplayer(o)
	cons, err := js.OrderedConsumer(ctx, events.Stream, jetstream.OrderedConsumerConfig{
		// Readers come and go (every page, every command): let the server
		// drop a forgotten consumer soon instead of after 5 minutes.
		InactiveThreshold: 10 * time.Second,
		FilterSubjects:    []string{events.TaskRoot + ".>", events.ReviewFilter},
	})
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	var all []stored
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				return nil, err
			}
			all = append(all, stored{subject: msg.Subject(), data: msg.Data(), at: md.Timestamp.UTC(), seq: md.Sequence.Stream,
				msgID: msg.Headers().Get(jetstream.MsgIDHeader)})
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("replay stalled with %d messages pending", pending)
		}
		pending -= uint64(n)
		r.out.Events += n
	}
	// Read after the replay: what aged out meanwhile is behind the horizon
	// too. A task submitted after it has every event on the stream (age
	// removes from the front).
	s, err := js.Stream(ctx, events.Stream)
	if err != nil {
		return nil, fmt.Errorf("rebuild: stream %s: %w", events.Stream, err)
	}
	if st := s.CachedInfo().State; st.FirstSeq > 1 {
		r.out.Horizon = st.FirstTime.UTC() // events before it are gone
	}
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

func newReplayer(o Options) *replayer {
	return &replayer{o: o, requeues: map[string]events.Action{}, missing: map[uint64]*Unavailable{}, decidedBy: map[passKey]uint64{},
		held: map[passKey]services.HeldEntry{}, admitted: map[passKey]bool{},
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
	// held is the entry the first held event (for trust) of each pass
	// implies; admitted the passes the gate let through.
	held     map[passKey]services.HeldEntry
	admitted map[passKey]bool
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
			return nil // waiting for canaries: neither the state nor the streak changes
		}
		r.gate(ev.Base, ev.Trust)
		r.fold(ev.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Hold(st, found, ev.Base, ev.Reason)
		})
		if p := (passKey{ev.Task.ID, ev.Run.Pass}); !hasKey(r.held, p) {
			r.held[p] = services.HeldEntry{Task: ev.Task.ID, Type: ev.Task.Type, Pass: ev.Run.Pass, Retry: ev.Run.Attempt > 1,
				Since: ev.At, Seq: m.seq, Reason: ev.Reason}
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
// held for its type's trust, at the pass it is held at, as the gate's look
// at that pass's held event put it to sleep (services.HeldEntry: Since
// its time, Seq its stream sequence). A pass the gate admitted has none,
// though the replayed state still shows it held until its attempt is
// recorded (the executor's running is in no event); the gate removed the
// entry when its look admitted it. Any other status has none: the gate
// removes the entry of a pass that stopped, ended or moved on.
func (r *replayer) heldIndex() map[string]*services.HeldEntry {
	out := map[string]*services.HeldEntry{}
	for id, st := range r.out.Tasks {
		p := passKey{id, st.Pass}
		e, ok := r.held[p]
		if st.Status != events.StatusHeld || !ok || r.admitted[p] {
			continue
		}
		out[e.Key()] = &e
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

// Store names in a Difference, besides the buckets' (events.BucketTasks,
// events.BucketTrust: the gate's facts; events.BucketHistory: each (type,
// subject)'s record, keyed by history.Key; events.BucketHeld: the held
// index, keyed by services.HeldEntry.Key).
const (
	// StoreOutcomes is the outcome stream (trust.OutcomeStream): each
	// type's outcomes, keyed by type.
	StoreOutcomes = "outcomes"
	// StoreSpend is the spend counters (trust.Spending), keyed by type/day.
	StoreSpend = "spend"
)

// Difference is one store entry where the live store and the replay disagree.
type Difference struct {
	Store string `json:"store"`
	Key   string `json:"key"`
	Field string `json:"field"`
	Live  string `json:"live"`
	Built string `json:"rebuilt"`
}

func (d Difference) String() string {
	return fmt.Sprintf("%s %s: %s live=%s rebuilt=%s", d.Store, d.Key, d.Field, d.Live, d.Built)
}

// Live are the live stores; one left nil is neither compared nor applied.
type Live struct {
	// Tasks is the task bucket; Trust the gate's facts per type; History
	// each (type, subject)'s last outcomes and failures (history.Store);
	// Held the gate's held index (services.HeldIndex).
	Tasks, Trust, History, Held jetstream.KeyValue
	// JS reads the outcome stream (and Apply rewrites it).
	JS       jetstream.JetStream
	Spending *trust.Spending
}

// Compare reports every difference between the live stores and rebuilt.
// Counters only the executor keeps (transient retries and their unbilled
// spend, failed tool calls, a cut-short tool loop kept to resume)
// and the submission's stream sequence are not derived from events and are
// left out; so are the canary places in the trust bucket (see
// Stores.Trust). Each type's outcomes are read as a trust.View reads them
// from the outcome stream, and its newest OutcomeDepth compared. Each
// record of the history bucket is compared field by field, as stored,
// with the rebuilt record of its key: a field no rebuilt record has (the
// "entries" of the former 50-entry layout) is a difference like any other.
// So is each entry of the held index, every field of it (see
// compareHeld).
func Compare(ctx context.Context, live Live, rebuilt *Stores) ([]Difference, error) {
	cur, err := readLive(ctx, live)
	if err != nil {
		return nil, err
	}
	rebuilt.keepBeforeHorizon(cur)
	rebuilt.keepAfterReplay(cur)
	var diffs []Difference
	if live.Tasks != nil {
		diffs = append(diffs, compareValues(events.BucketTasks, cur.tasks, rebuilt.Tasks, normTask, nil)...)
	}
	if live.Trust != nil {
		diffs = append(diffs, compareValues(events.BucketTrust, cur.facts, rebuilt.Trust, gateFacts, noGateFacts)...)
	}
	if live.JS != nil {
		diffs = append(diffs, compareValues(StoreOutcomes, cur.outcomes, rebuilt.Trust, newestOutcomes, noOutcomes)...)
	}
	if live.History != nil {
		diffs = append(diffs, compareValues(events.BucketHistory, cur.history, asStored(rebuilt.History), same[json.RawMessage], nil)...)
	}
	if live.Spending != nil {
		diffs = append(diffs, compareSpend(cur.spend, rebuilt.Spend)...)
	}
	if live.Held != nil {
		diffs = append(diffs, compareHeld(cur.held, rebuilt.Held)...)
	}
	return diffs, nil
}

// compareHeld compares the held index as stored, entry by entry and field
// by field, with the rebuilt entries: its keys (type, since, task, pass),
// and every field, Seq and Reason too. Those two are not part of the key,
// yet a live entry holds the rebuilt ones whenever the pass is held on
// both sides: the gate writes an entry only from a look at the pass's held
// event or at a wake of it — the same payload, so the same Reason (and
// Since, Retry) — and never over an entry already there (HeldIndex.Put
// creates), so the entry keeps the Seq of the held event's own look, the
// first. A later look (a wake) writes one only after the entry was
// removed, which a look does only when the pass left the hold (admitted,
// stopped, ended by a human, moved on): that entry is a stale one, which
// the rebuilt index lacks, and is reported as extra. A second held event
// of the pass (its verified event redelivered past the stream's
// deduplication window) has its own time, so its own key: extra too, the
// pass still asleep under its first.
func compareHeld(live map[string]*json.RawMessage, rebuilt map[string]*services.HeldEntry) []Difference {
	return compareValues(events.BucketHeld, live, heldAsStored(rebuilt), same[json.RawMessage], nil)
}

// heldAsStored is each rebuilt held entry as the held index stores it.
func heldAsStored(entries map[string]*services.HeldEntry) map[string]*json.RawMessage {
	out := make(map[string]*json.RawMessage, len(entries))
	for k, e := range entries {
		raw := marshal(e)
		out[k] = &raw
	}
	return out
}

// current is what the live stores hold, each read as the services read it.
type current struct {
	tasks    map[string]*events.TaskState
	facts    map[string]*trust.Stats     // the trust bucket: gate facts, by type
	outcomes map[string]*trust.Stats     // the outcome stream: Outcomes only, by type
	history  map[string]*json.RawMessage // the history bucket, as stored, by history.Key
	spend    map[[2]string]trust.DaySpend
	held     map[string]*json.RawMessage // the held index, as stored, by services.HeldEntry.Key
}

// readLive reads the stores of live that are set.
func readLive(ctx context.Context, live Live) (*current, error) {
	cur := &current{}
	var err error
	if live.Tasks != nil {
		if cur.tasks, err = readBucket[events.TaskState](ctx, live.Tasks); err != nil {
			return nil, err
		}
	}
	if live.Trust != nil {
		if cur.facts, err = readBucket[trust.Stats](ctx, live.Trust); err != nil {
			return nil, err
		}
	}
	if live.JS != nil {
		if cur.outcomes, err = readOutcomes(ctx, live.JS); err != nil {
			return nil, err
		}
	}
	if live.History != nil {
		if cur.history, err = readBucket[json.RawMessage](ctx, live.History); err != nil {
			return nil, err
		}
	}
	if live.Spending != nil {
		if cur.spend, err = live.Spending.All(ctx); err != nil {
			return nil, err
		}
	}
	if live.Held != nil {
		if cur.held, err = readBucket[json.RawMessage](ctx, live.Held); err != nil {
			return nil, err
		}
	}
	return cur, nil
}

// readOutcomes reads every type's outcomes from the outcome stream, as the
// gate's trust.View holds them.
func readOutcomes(ctx context.Context, js jetstream.JetStream) (map[string]*trust.Stats, error) {
	v, err := trust.NewView(ctx, js, nil, nil)
	if err != nil {
		return nil, err
	}
	defer v.Stop()
	out := map[string]*trust.Stats{}
	for _, st := range v.All() {
		out[st.Type] = &st
	}
	return out, nil
}

// readBucket reads every value of a bucket.
func readBucket[T any](ctx context.Context, kv jetstream.KeyValue) (map[string]*T, error) {
	keys, err := keysOf(ctx, kv)
	if err != nil {
		return nil, err
	}
	out := map[string]*T{}
	for _, k := range keys {
		v, _, found, err := kvcas.Get[T](ctx, kv, k)
		if err != nil {
			return nil, err
		}
		if found {
			out[k] = &v
		}
	}
	return out, nil
}

// asStored is each rebuilt history record as the history bucket would
// store it (its JSON), for comparing with the bucket's values as they are.
func asStored(records map[string]*history.Record) map[string]*json.RawMessage {
	out := make(map[string]*json.RawMessage, len(records))
	for k, rec := range records {
		raw := marshal(rec)
		out[k] = &raw
	}
	return out
}

// gateFacts is what the trust bucket holds that events imply: the block
// streak and the remembered gate decisions (no outcomes, no canary places).
func gateFacts(s trust.Stats) trust.Stats {
	return trust.Stats{Type: s.Type, BlockStreak: s.BlockStreak, Gates: s.Gates}
}

// noGateFacts: a type the gate never blocked (or whose streak it reset
// with no decision remembered) needs no entry in the trust bucket.
func noGateFacts(s trust.Stats) bool { return s.BlockStreak == 0 && len(s.Gates) == 0 }

// OutcomeDepth is how many of a type's newest outcomes Compare holds to
// the rebuilt ones: the largest window a policy may score
// (trust.MaxWindow). The stream keeps trust.Keep, twice as many, and those
// beyond the newest OutcomeDepth are not derived from events alone: the
// stream keeps the last Keep it received, and concurrent recorders publish
// outcomes in an order no event records (an outcome of 12:00:01 may arrive
// after one of 12:00:02, and a redelivered one 30 seconds late). The
// newest OutcomeDepth by (At, Key) are the same whatever that order,
// unless more than Keep − OutcomeDepth outcomes of the type were late at
// once.
const OutcomeDepth = trust.MaxWindow

// newestOutcomes is what Compare holds to the rebuilt outcomes of a type.
func newestOutcomes(s trust.Stats) trust.Stats {
	return trust.Stats{Type: s.Type, Outcomes: lastN(s.Outcomes, OutcomeDepth)}
}

func noOutcomes(s trust.Stats) bool { return len(s.Outcomes) == 0 }

func same[T any](v T) T { return v }

func lastN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// compareValues compares every key of one live store with the rebuilt
// values, both seen through norm; a value vacant reports (after norm)
// counts as no entry (nil: none does).
func compareValues[T any](store string, live, rebuilt map[string]*T, norm func(T) T, vacant func(T) bool) []Difference {
	var diffs []Difference
	for _, k := range slices.Sorted(maps.Keys(union(live, rebuilt))) {
		diffs = append(diffs, entryDiffs(store, k, live[k], rebuilt[k], norm, vacant)...)
	}
	return diffs
}

// entryDiffs compares one key's live and rebuilt values (nil: no entry).
func entryDiffs[T any](store, key string, lv, bv *T, norm func(T) T, vacant func(T) bool) []Difference {
	present := func(v *T) (T, bool) {
		var n T
		if v == nil {
			return n, false
		}
		n = norm(*v)
		return n, vacant == nil || !vacant(n)
	}
	l, lok := present(lv)
	b, bok := present(bv)
	switch {
	case !lok && !bok:
		return nil
	case !lok:
		return []Difference{{store, key, "(entry)", "missing", "present"}}
	case !bok:
		return []Difference{{store, key, "(entry)", "present", "missing"}}
	}
	return fieldDiffs(store, key, l, b)
}

func union[V any](ms ...map[string]V) map[string]bool {
	keys := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			keys[k] = true
		}
	}
	return keys
}

// compareSpend compares the live spend counters with the rebuilt ones.
func compareSpend(have, rebuilt map[[2]string]trust.DaySpend) []Difference {
	keys := map[string][2]string{}
	for k := range have {
		keys[k[0]+"/"+k[1]] = k
	}
	for k := range rebuilt {
		keys[k[0]+"/"+k[1]] = k
	}
	var diffs []Difference
	for _, name := range slices.Sorted(maps.Keys(keys)) {
		h, b := have[keys[name]], rebuilt[keys[name]]
		if h.Tokens != b.Tokens {
			diffs = append(diffs, Difference{StoreSpend, name, "tokens", fmt.Sprint(h.Tokens), fmt.Sprint(b.Tokens)})
		}
		if h.NanoUSD != b.NanoUSD {
			diffs = append(diffs, Difference{StoreSpend, name, "nanousd", fmt.Sprint(h.NanoUSD), fmt.Sprint(b.NanoUSD)})
		}
	}
	return diffs
}

// Apply overwrites the live stores with the rebuilt ones: every task
// state; the gate facts of the types whose facts differ (their canary
// places kept, compare-and-set against the gate); the history records
// that differ (history.Store.Put; one no event implies is deleted); the
// outcomes of each type that differ — their subject purged and the
// rebuilt messages published again, oldest first; the spend counters
// corrected to the rebuilt totals; the held index's entries that differ
// (one missing written, one no event implies deleted). Applied again, it
// finds nothing more to rewrite in the history bucket, the held index or
// on the outcome stream.
//
// A service that follows the outcome stream (the gate's trust.View) does
// not see a purge: run Apply with the mesh stopped, or restart it after.
func Apply(ctx context.Context, live Live, rebuilt *Stores) error {
	cur, err := readLive(ctx, Live{Trust: live.Trust, History: live.History, Held: live.Held, JS: live.JS, Spending: live.Spending})
	if err != nil {
		return err
	}
	rebuilt.keepBeforeHorizon(cur)
	rebuilt.keepAfterReplay(cur)
	if live.Tasks != nil {
		for _, k := range slices.Sorted(maps.Keys(rebuilt.Tasks)) {
			if err := applyTask(ctx, live.Tasks, k, *rebuilt.Tasks[k], rebuilt.Horizon); err != nil {
				return err
			}
		}
	}
	if live.Trust != nil {
		if err := applyGateFacts(ctx, live.Trust, cur.facts, rebuilt.Trust); err != nil {
			return err
		}
	}
	if live.History != nil {
		if err := applyHistory(ctx, live.History, cur.history, rebuilt.History); err != nil {
			return err
		}
	}
	if live.Held != nil {
		if err := applyHeld(ctx, live.Held, cur.held, rebuilt.Held); err != nil {
			return err
		}
	}
	if live.JS != nil {
		// Purged messages keep their Msg-Id in the stream's deduplication
		// window: published again under it, they would be dropped as
		// duplicates. The rebuilt ones carry it salted, once per Apply.
		salt := "rebuilt-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		if err := applyOutcomes(ctx, live.JS, cur.outcomes, rebuilt.Trust, salt); err != nil {
			return err
		}
	}
	if live.Spending == nil {
		return nil
	}
	for k := range cur.spend {
		if _, ok := rebuilt.Spend[k]; !ok {
			rebuilt.Spend[k] = trust.DaySpend{Type: k[0], Day: k[1]}
		}
	}
	for k, want := range rebuilt.Spend {
		if err := live.Spending.CorrectTo(ctx, cur.spend[k], want); err != nil {
			return err
		}
	}
	return nil
}

// applyGateFacts writes the rebuilt block streak and gate decisions of
// each type whose facts differ, keeping the canary places the gate holds.
func applyGateFacts(ctx context.Context, kv jetstream.KeyValue, have, rebuilt map[string]*trust.Stats) error {
	for _, k := range slices.Sorted(maps.Keys(union(have, rebuilt))) {
		if entryDiffs(events.BucketTrust, k, have[k], rebuilt[k], gateFacts, noGateFacts) == nil {
			continue
		}
		var want trust.Stats
		if b := rebuilt[k]; b != nil {
			want = gateFacts(*b)
		}
		_, err := kvcas.Update(ctx, kv, k, func(st *trust.Stats, _ bool) error {
			st.Type, st.BlockStreak, st.Gates, st.Outcomes = k, want.BlockStreak, want.Gates, nil
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s %s: %w", events.BucketTrust, k, err)
		}
	}
	return nil
}

// applyOutcomes rewrites the outcome subject of each type whose outcomes differ.
func applyOutcomes(ctx context.Context, js jetstream.JetStream, have, rebuilt map[string]*trust.Stats, salt string) error {
	for _, typ := range slices.Sorted(maps.Keys(union(have, rebuilt))) {
		if entryDiffs(StoreOutcomes, typ, have[typ], rebuilt[typ], newestOutcomes, noOutcomes) == nil {
			continue
		}
		var msgs []*nats.Msg
		if b := rebuilt[typ]; b != nil {
			for _, o := range lastN(b.Outcomes, trust.Keep) {
				m, err := trust.OutcomeMsg(typ, o)
				if err != nil {
					return err
				}
				msgs = append(msgs, m)
			}
		}
		if err := rewrite(ctx, js, trust.OutcomeStream, trust.OutcomeSubject(typ), msgs, salt); err != nil {
			return err
		}
	}
	return nil
}

// applyHistory writes the rebuilt record of each (type, subject) whose
// record in the history bucket differs, and deletes the records no event
// implies.
func applyHistory(ctx context.Context, kv jetstream.KeyValue, have map[string]*json.RawMessage, rebuilt map[string]*history.Record) error {
	store := history.NewStore(kv)
	want := asStored(rebuilt)
	for _, k := range slices.Sorted(maps.Keys(union(have, want))) {
		if entryDiffs(events.BucketHistory, k, have[k], want[k], same[json.RawMessage], nil) == nil {
			continue
		}
		var err error
		if rec := rebuilt[k]; rec != nil {
			err = store.Put(ctx, *rec)
		} else if err = kv.Delete(ctx, k); errors.Is(err, jetstream.ErrKeyNotFound) {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", events.BucketHistory, k, err)
		}
	}
	return nil
}

// applyHeld writes the rebuilt held entries missing from the held index or
// differing there, and deletes the entries no event implies. A pass
// written back sleeps until the gate's sweeper wakes it, as if its look
// had put it there.
func applyHeld(ctx context.Context, kv jetstream.KeyValue, have map[string]*json.RawMessage, rebuilt map[string]*services.HeldEntry) error {
	want := heldAsStored(rebuilt)
	for _, k := range slices.Sorted(maps.Keys(union(have, want))) {
		if entryDiffs(events.BucketHeld, k, have[k], want[k], same[json.RawMessage], nil) == nil {
			continue
		}
		var err error
		if raw := want[k]; raw != nil {
			_, err = kv.Put(ctx, k, *raw)
		} else {
			err = services.NewHeldIndex(kv).Delete(ctx, k)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", events.BucketHeld, k, err)
		}
	}
	return nil
}

// rewrite purges subject from stream and publishes msgs on it in order,
// each under its Msg-Id salted with salt.
func rewrite(ctx context.Context, js jetstream.JetStream, stream, subject string, msgs []*nats.Msg, salt string) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return fmt.Errorf("purge %s: %w", subject, err)
	}
	for _, m := range msgs {
		m.Header.Set(nats.MsgIdHdr, m.Header.Get(nats.MsgIdHdr)+":"+salt)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return fmt.Errorf("publish %s: %w", subject, err)
		}
	}
	return nil
}

func marshal(v any) json.RawMessage {
	data, _ := json.Marshal(v)
	return data
}

// applyTask writes the rebuilt state of task k where it differs from the
// live one in what events decide (normTask), under compare-and-set: what
// only the executor keeps — its transient count, unbilled spend, tool loop
// to resume, banned tool calls, the submission's sequence — is the live
// state's, which the events cannot say; a task whose state holds nothing
// else different is not written at all.
func applyTask(ctx context.Context, kv jetstream.KeyValue, k string, built events.TaskState, horizon time.Time) error {
	_, err := kvcas.Update(ctx, kv, k, func(st *events.TaskState, found bool) error {
		if found && len(entryDiffs(events.BucketTasks, k, st, &built, normTask, nil)) == 0 {
			return kvcas.ErrNoChange
		}
		if found && st.CreatedAt.Before(horizon) || built.CreatedAt.Before(horizon) {
			return kvcas.ErrNoChange // its first events are gone: the replay knows only its end
		}
		next := built
		if found {
			next.SubmitSeq, next.TransientRetries, next.Unbilled, next.Resume = st.SubmitSeq, st.TransientRetries, st.Unbilled, st.Resume
			for _, e := range st.FailedRequests {
				if strings.HasPrefix(e, "tool:") && !slices.Contains(next.FailedRequests, e) {
					next.FailedRequests = append(slices.Clone(next.FailedRequests), e)
				}
			}
		}
		*st = next
		return nil
	})
	return err
}

// keepBeforeHorizon takes into s, rebuilt from a stream whose first events
// aged out (Horizon set), what the live stores cur know from before the
// horizon, as they hold it: a task created before it (its replay would be
// partial), each history entry and trust outcome dated before it, each
// day's spend up to the horizon's day, the held entries of a task created
// before it or held since before it. So Compare reports, and Apply
// writes, only what the replayed events decide. Idempotent.
func (s *Stores) keepBeforeHorizon(cur *current) {
	h := s.Horizon
	if h.IsZero() {
		return
	}
	// The tasks created before the horizon, by either side's state.
	early := map[string]bool{}
	for _, tasks := range []map[string]*events.TaskState{s.Tasks, cur.tasks} {
		for k, st := range tasks {
			if st.CreatedAt.Before(h) {
				early[k] = true
			}
		}
	}
	// The gate facts — a block streak, the gate's remembered decisions —
	// may have begun before the horizon: the replay cannot tell.
	for typ, live := range cur.facts {
		st, ok := s.Trust[typ]
		if !ok {
			st = &trust.Stats{Type: typ}
			s.Trust[typ] = st
		}
		st.BlockStreak, st.Gates = live.BlockStreak, live.Gates
	}
	for k, st := range cur.tasks {
		if st.CreatedAt.Before(h) {
			kept := *st
			s.Tasks[k] = &kept
		}
	}
	for k, b := range s.Tasks {
		if b.CreatedAt.Before(h) && cur.tasks != nil && cur.tasks[k] == nil {
			delete(s.Tasks, k) // partial, and gone from the live bucket
		}
	}
	for k, raw := range cur.history {
		var live history.Record
		if raw == nil || json.Unmarshal(*raw, &live) != nil {
			continue
		}
		rec, ok := s.History[k]
		if !ok {
			rec = &history.Record{Type: live.Type, Subject: live.Subject}
		}
		next := *rec
		for _, e := range append(slices.Clone(live.Outcomes), live.Failures...) {
			if e.At.Before(h) {
				next, _ = next.Add(e)
			}
		}
		if ok || len(next.Outcomes) > 0 {
			s.History[k] = &next
		}
	}
	for typ, live := range cur.outcomes {
		st, ok := s.Trust[typ]
		if !ok {
			st = &trust.Stats{Type: typ}
		}
		for _, o := range live.Outcomes {
			if o.At.Before(h) {
				st.Outcomes, _ = trust.Insert(st.Outcomes, o, trust.Keep)
			}
		}
		if ok || len(st.Outcomes) > 0 {
			s.Trust[typ] = st
		}
	}
	day := trust.Day(h)
	for k, v := range cur.spend {
		if k[1] <= day { // the horizon's day is only partly replayed
			s.Spend[k] = v
		}
	}
	// A task created before the horizon is held, or not, as the live
	// stores say (its replayed state is partial): its held entries too,
	// and any entry held since before it (its held event is gone).
	if cur.held == nil {
		return
	}
	if s.Held == nil {
		s.Held = map[string]*services.HeldEntry{}
	}
	for k, e := range s.Held {
		if early[e.Task] && cur.held[k] == nil {
			delete(s.Held, k)
		}
	}
	for k, raw := range cur.held {
		if e, ok := decodeHeld(k, raw); ok && (early[e.Task] || e.Since.Before(h)) {
			s.Held[k] = &e
		}
	}
}

// keepAfterReplay takes into s, as the live stores hold them, the held
// entries naming a stream message stored after the last one replayed: a
// pass the gate held meanwhile, which the replay knows nothing of. Compare
// does not report them and Apply neither deletes nor rewrites them (the
// pass of a deleted entry would sleep unwoken). Idempotent.
func (s *Stores) keepAfterReplay(cur *current) {
	if cur.held == nil {
		return
	}
	if s.Held == nil {
		s.Held = map[string]*services.HeldEntry{}
	}
	for k, raw := range cur.held {
		if e, ok := decodeHeld(k, raw); ok && e.Seq > s.replayed {
			s.Held[k] = &e
		}
	}
}

// decodeHeld decodes a held index entry as stored; ok is false for one
// unreadable or not under its own key.
func decodeHeld(key string, raw *json.RawMessage) (services.HeldEntry, bool) {
	if raw == nil {
		return services.HeldEntry{}, false
	}
	e, err := services.DecodeHeldEntry(key, *raw)
	return e, err == nil
}

// normTask leaves out what is not derived from events.
func normTask(st events.TaskState) events.TaskState {
	st.SubmitSeq, st.TransientRetries, st.Unbilled, st.Resume = 0, 0, events.Usage{}, nil
	st.FailedRequests = slices.DeleteFunc(slices.Clone(st.FailedRequests), func(h string) bool { return strings.HasPrefix(h, "tool:") })
	if len(st.FailedRequests) == 0 {
		st.FailedRequests = nil
	}
	return st
}

func keysOf(ctx context.Context, kv jetstream.KeyValue) ([]string, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	return keys, nil
}

// fieldDiffs compares two values field by field through their JSON form;
// numbers compare with a small tolerance (sums of costs in another order).
func fieldDiffs(store, key string, live, built any) []Difference {
	lm, bm := toMap(live), toMap(built)
	var diffs []Difference
	fields := map[string]bool{}
	for f := range lm {
		fields[f] = true
	}
	for f := range bm {
		fields[f] = true
	}
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		if !equalJSON(lm[f], bm[f]) {
			l, b := describe(lm[f], bm[f])
			diffs = append(diffs, Difference{store, key, f, l, b})
		}
	}
	return diffs
}

// describe shows two differing field values. Lists of keyed entries
// (outcomes, history entries, gate decisions) can be long and differ at
// their end: they are described by key — the entries only one side holds,
// or else the first entry both hold that differs. Anything else is shown
// clipped.
func describe(live, built json.RawMessage) (string, string) {
	lk, lok := keyed(live)
	bk, bok := keyed(built)
	if !lok || !bok {
		return clip(live), clip(built)
	}
	only := func(a, b []keyedEntry) []string {
		var keys []string
		for _, e := range a {
			if !slices.ContainsFunc(b, func(x keyedEntry) bool { return x.Key == e.Key }) {
				keys = append(keys, e.Key)
			}
		}
		return keys
	}
	side := func(entries []keyedEntry, only []string) string {
		s := fmt.Sprintf("%d entries", len(entries))
		if len(entries) == 1 {
			s = "1 entry"
		}
		if len(only) > 0 {
			s += ", only here: " + strings.Join(only, " ")
		}
		return s
	}
	if lo, bo := only(lk, bk), only(bk, lk); len(lo) > 0 || len(bo) > 0 {
		return clipText(side(lk, lo)), clipText(side(bk, bo))
	}
	for _, l := range lk {
		i := slices.IndexFunc(bk, func(x keyedEntry) bool { return x.Key == l.Key })
		if !equalJSON(l.Raw, bk[i].Raw) {
			return clip(l.Raw), clip(bk[i].Raw)
		}
	}
	order := func(entries []keyedEntry) string {
		keys := make([]string, len(entries))
		for i, e := range entries {
			keys[i] = e.Key
		}
		return clipText("in the order " + strings.Join(keys, " "))
	}
	return order(lk), order(bk)
}

// keyedEntry is one entry of a list of JSON objects that have a "key".
type keyedEntry struct {
	Key string
	Raw json.RawMessage
}

// keyed reads raw as a list of keyed entries (null or left out: none); ok
// is false when it is not one.
func keyed(raw json.RawMessage) (entries []keyedEntry, ok bool) {
	if len(raw) == 0 {
		return nil, true
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, false
	}
	for _, r := range list {
		var e struct {
			Key *string `json:"key"`
		}
		if json.Unmarshal(r, &e) != nil || e.Key == nil {
			return nil, false
		}
		entries = append(entries, keyedEntry{*e.Key, r})
	}
	return entries, true
}

func toMap(v any) map[string]json.RawMessage {
	data, _ := json.Marshal(v)
	m := map[string]json.RawMessage{}
	_ = json.Unmarshal(data, &m)
	return m
}

func equalJSON(a, b json.RawMessage) bool {
	var x, y any
	_ = json.Unmarshal(a, &x)
	_ = json.Unmarshal(b, &y)
	return near(x, y)
}

func near(x, y any) bool {
	switch a := x.(type) {
	case float64:
		b, ok := y.(float64)
		return ok && math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(a))
	case map[string]any:
		b, ok := y.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k := range a {
			if !near(a[k], b[k]) {
				return false
			}
		}
		return true
	case []any:
		b, ok := y.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !near(a[i], b[i]) {
				return false
			}
		}
		return true
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}

func clip(b json.RawMessage) string {
	s := string(b)
	if s == "" {
		s = "(none)"
	}
	return clipText(s)
}

func clipText(s string) string {
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
