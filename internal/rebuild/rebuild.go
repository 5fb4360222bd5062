// Package rebuild recomputes the derived stores — task state, trust stats,
// outcome history — from the event stream alone, with the same pure functions
// the services use, and compares them with the live stores. After a normal
// run they agree; a difference means a store was written outside the events
// (or lost), and Apply can restore it from the stream.
package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/history"
	"dispatchmesh/internal/kvcas"
	"dispatchmesh/internal/policy"
	"dispatchmesh/internal/task"
	"dispatchmesh/trust"
)

// Stores are what a replay produces.
type Stores struct {
	Tasks   map[string]*events.TaskState
	Trust   map[string]*trust.Stats
	History map[string]*history.Record
	// Spend is what each (type, UTC day) spent: the spend counters.
	Spend map[[2]string]trust.DaySpend
	// Events is how many stream messages were replayed.
	Events int
	// Skipped are the events that could not be decoded: reported and left
	// out, the rest of the stream replayed. The mesh could not decode them
	// either (their service dead-lettered them), so it never applied them.
	Skipped []Skipped
	// Fallbacks are the policy revisions events named that the bucket does
	// not hold, recomputed with Options.Fallback instead.
	Fallbacks []Unavailable
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
	// HistoryLimit is the history store's per-key limit (default 50).
	HistoryLimit int
}

// Replay reads every task event and review record on the stream, in order,
// and folds them into fresh stores. An event it cannot decode is skipped and
// listed in Stores.Skipped; only failing to read the stream is an error.
func Replay(ctx context.Context, js jetstream.JetStream, o Options) (*Stores, error) {
	if o.HistoryLimit <= 0 {
		o.HistoryLimit = history.DefaultLimit
	}
	if o.Policy == nil && o.Revisions == nil {
		return nil, errors.New("rebuild: no policy: set Options.Revisions (or Options.Policy)")
	}
	r := &replayer{o: o, requeues: map[string]events.Action{}, missing: map[uint64]*Unavailable{}, decidedBy: map[passKey]uint64{}, out: &Stores{
		Tasks: map[string]*events.TaskState{}, Trust: map[string]*trust.Stats{}, History: map[string]*history.Record{},
		Spend: map[[2]string]trust.DaySpend{},
	}}
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
	for _, m := range all {
		r.recorderDecision(m)
	}
	for _, m := range all {
		if err := r.apply(m.subject, m.data, m.at); err != nil {
			r.out.Skipped = append(r.out.Skipped, Skipped{Subject: m.subject, Seq: m.seq, Error: err.Error()})
		}
	}
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

func (r *replayer) apply(subject string, data []byte, stored time.Time) error {
	if reason, _, ok := events.ParseReviewSubject(subject); ok {
		return r.review(reason, data)
	}
	_, stage, ok := events.ParseTaskSubject(subject)
	if !ok {
		return nil
	}
	switch stage {
	case events.StageQueued:
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
		r.gate(ev.Base, ev.Trust, false)
	case events.StageExecuted:
		var ev events.Executed
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		r.executed(ev, stored)
	}
	return nil
}

func (r *replayer) review(reason string, data []byte) error {
	switch reason {
	case events.ReviewGated:
		var ev events.Gated
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		r.gate(ev.Base, ev.Trust, true)
		r.release(ev.Task.Type, ev.Task.ID)
		r.fold(ev.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.Block(st, found, ev.Base, ev.Reason, ev.Trust.Cause)
		})
	case events.ReviewEscalated:
		var ev events.Escalated
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		if ev.Cause != events.CauseRungRate {
			return nil // the recorder's handoffs are replayed from their attempts
		}
		r.release(ev.Task.Type, ev.Task.ID)
		r.fold(ev.Task.ID, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
			return task.HandOff(st, found, ev.Base, ev.Reason)
		})
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

// release mirrors a task giving up its canary place when it ends.
func (r *replayer) release(taskType, id string) {
	if s, ok := r.out.Trust[taskType]; ok {
		*s, _ = trust.Release(*s, id)
	}
}

// gate mirrors the gate's writes to its type's trust stats: the block
// streak (trust.Policy.Gate) and the canary places (trust.Policy.AdmitCanary).
func (r *replayer) gate(b events.Base, d events.TrustDecision, blocked bool) {
	s := r.stats(b.Task.Type)
	var below bool
	switch d.Cause {
	case events.CauseTrust:
		if b.Run.Attempt > 1 {
			return // a retry stopped: only new tasks count towards the streak
		}
		below = true
	case events.CauseProbe:
		if !d.Probe {
			return // a probe's retry: the gate did not weigh trust
		}
		below = true
	case events.CauseTrusted:
	case events.CauseUnproven:
		scoring := r.policyFor(b.PolicyRev, b.Task.Type).Scoring(r.o.Scoring)
		*s, _, _ = scoring.AdmitCanary(*s, b.Task.ID, b.At)
		return
	case "": // recorded before gate causes existed: read the decision as it was then
		switch {
		case blocked:
			if !strings.HasPrefix(d.Reason, "Blocked: "+b.Task.Type+" trust score") {
				return // a budget block does not touch the streak
			}
			below = true
		case d.Probe:
			below = true
		case b.Run.Reviewed || d.Exempt || b.Run.Pass > 1: // the gate did not weigh trust
			return
		}
	default: // exempt, reviewed, budget, rung_rate: the gate did not weigh trust
		return
	}
	if !below && s.BlockStreak == 0 {
		return
	}
	next, _, _ := r.o.Scoring.Gate(*s, events.MsgID(b.Task.ID, b.Run.Pass, "gate"), below)
	*s = next
}

// executed mirrors the executor's and the recorder's writes for one attempt.
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
	hk := history.Key(t.Type, t.Subject)
	rec := r.out.History[hk]
	if rec == nil {
		rec = &history.Record{Type: t.Type, Subject: t.Subject}
		r.out.History[hk] = rec
	}
	rec.Entries, _ = history.Insert(rec.Entries, history.Entry{
		Key: key, TaskID: t.ID, Attempt: b.Run.Attempt, Rung: b.Run.Rung, Step: b.Run.Step,
		Outcome: res.Outcome, Approach: res.Approach, Summary: res.Summary, Error: res.Error, At: stored,
	}, r.o.HistoryLimit)
	if tokens := res.TokensIn + res.TokensOut; tokens != 0 || res.Cost != 0 {
		k := [2]string{t.Type, trust.Day(stored)}
		d := r.out.Spend[k]
		d.Type, d.Day = k[0], k[1]
		d.Tokens += int64(tokens)
		d.NanoUSD += trust.NanoUSD(res.Cost)
		r.out.Spend[k] = d
	}
	if task.CountsForTrust(res) {
		s := r.stats(t.Type)
		*s, _ = r.o.Scoring.Record(*s, task.TrustOutcome(key, b.Run, res, stored))
	}
	*st = next
	if st.Decision != events.DecisionRetry {
		r.release(t.Type, t.ID)
	}
}

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

// Live are the live stores.
type Live struct {
	Tasks, Trust, History jetstream.KeyValue
	Spending              *trust.Spending
}

// Compare reports every difference between the live stores and rebuilt.
// Counters only the executor keeps (transient retries and their unbilled
// spend, failed tool calls, a cut-short tool loop kept to resume)
// and the submission's stream sequence are not derived from events and are
// left out.
func Compare(ctx context.Context, live Live, rebuilt *Stores) ([]Difference, error) {
	tasks, err := compareBucket(ctx, events.BucketTasks, live.Tasks, rebuilt.Tasks, normTask)
	if err != nil {
		return nil, err
	}
	stats, err := compareBucket(ctx, events.BucketTrust, live.Trust, rebuilt.Trust, same[trust.Stats])
	if err != nil {
		return nil, err
	}
	hist, err := compareBucket(ctx, events.BucketHistory, live.History, rebuilt.History, same[history.Record])
	if err != nil {
		return nil, err
	}
	spend, err := compareSpend(ctx, live.Spending, rebuilt.Spend)
	if err != nil {
		return nil, err
	}
	return slices.Concat(tasks, stats, hist, spend), nil
}

// compareSpend compares the live spend counters with the rebuilt ones.
func compareSpend(ctx context.Context, live *trust.Spending, rebuilt map[[2]string]trust.DaySpend) ([]Difference, error) {
	if live == nil {
		return nil, nil
	}
	have, err := live.All(ctx)
	if err != nil {
		return nil, err
	}
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
			diffs = append(diffs, Difference{"spend", name, "tokens", fmt.Sprint(h.Tokens), fmt.Sprint(b.Tokens)})
		}
		if h.NanoUSD != b.NanoUSD {
			diffs = append(diffs, Difference{"spend", name, "nanousd", fmt.Sprint(h.NanoUSD), fmt.Sprint(b.NanoUSD)})
		}
	}
	return diffs, nil
}

func same[T any](v T) T { return v }

// compareBucket compares every key of one live bucket with the rebuilt
// values, both seen through norm.
func compareBucket[T any](ctx context.Context, store string, kv jetstream.KeyValue, rebuilt map[string]*T, norm func(T) T) ([]Difference, error) {
	keys, err := keysOf(ctx, kv)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, k := range keys {
		seen[k] = true
	}
	for k := range rebuilt {
		seen[k] = true
	}
	var diffs []Difference
	for _, k := range slices.Sorted(maps.Keys(seen)) {
		lv, _, found, err := kvcas.Get[T](ctx, kv, k)
		if err != nil {
			return nil, err
		}
		bv, ok := rebuilt[k]
		switch {
		case !found:
			diffs = append(diffs, Difference{store, k, "(entry)", "missing", "present"})
		case !ok:
			diffs = append(diffs, Difference{store, k, "(entry)", "present", "missing"})
		default:
			diffs = append(diffs, fieldDiffs(store, k, norm(lv), norm(*bv))...)
		}
	}
	return diffs, nil
}

// Apply overwrites the live stores with the rebuilt ones.
func Apply(ctx context.Context, live Live, rebuilt *Stores) error {
	put := func(kv jetstream.KeyValue, key string, v any) error {
		data, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = kv.Put(ctx, key, data)
		return err
	}
	for k, st := range rebuilt.Tasks {
		if err := put(live.Tasks, k, st); err != nil {
			return err
		}
	}
	for k, s := range rebuilt.Trust {
		if err := put(live.Trust, k, s); err != nil {
			return err
		}
	}
	for k, rec := range rebuilt.History {
		if err := put(live.History, k, rec); err != nil {
			return err
		}
	}
	if live.Spending == nil {
		return nil
	}
	have, err := live.Spending.All(ctx)
	if err != nil {
		return err
	}
	for k := range have {
		if _, ok := rebuilt.Spend[k]; !ok {
			rebuilt.Spend[k] = trust.DaySpend{Type: k[0], Day: k[1]}
		}
	}
	for k, want := range rebuilt.Spend {
		if err := live.Spending.CorrectTo(ctx, have[k], want); err != nil {
			return err
		}
	}
	return nil
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
			diffs = append(diffs, Difference{store, key, f, clip(lm[f]), clip(bm[f])})
		}
	}
	return diffs
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
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
