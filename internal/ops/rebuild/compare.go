package rebuild

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

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
// Stores.Trust), and a type's gate facts that its recorded streak steps
// give in another commit order than the stream's (keepCommitOrder). Each
// type's outcomes are read as a trust.View reads them
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
	rebuilt.keepCommitOrder(cur)
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

func marshal(v any) json.RawMessage {
	data, _ := json.Marshal(v)
	return data
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

// gateSteps are one type's steps of its block streak (trust.StreakStep)
// as their events recorded them: each new task's pass below its threshold
// by its gate key, with the answer the gate's compare-and-set gave it (let
// through as the probe, or held), and how many trusted passes may have
// reset the streak.
type gateSteps struct {
	marks  map[string]bool // gate key → probe
	resets int
}

// stepOf notes the step of the streak that the gate's decision d on b's
// pass took (r.gate).
func (s *Stores) stepOf(b events.Base, d events.TrustDecision, below bool) {
	if s.steps == nil {
		s.steps = map[string]*gateSteps{}
	}
	g := s.steps[b.Task.Type]
	if g == nil {
		g = &gateSteps{marks: map[string]bool{}}
		s.steps[b.Task.Type] = g
	}
	if !below {
		g.resets++
		return
	}
	key := events.MsgID(b.Task.ID, b.Run.Pass, "gate")
	if _, seen := g.marks[key]; !seen { // a redelivery gets the answer the first got
		g.marks[key] = d.Probe
	}
}

// keepCommitOrder takes into s, as the live trust bucket holds them, the
// gate facts of each type that the same steps of its block streak give in
// the order the gate committed them (allows). The replay steps the streak
// in stream order, but the gate's workers — of one instance, the steps of
// a burst written in one compare-and-set, or of several — commit their
// steps to the bucket first and publish their events after, each on its
// own: two passes decided at once may be committed in one order and
// stored on the stream in the other. The second committed then holds the
// answer the first would get in stream order (the probe, or the step that
// earned it), and the streak left after them may differ too; no event
// records the commit order. So Compare reports, and Apply rewrites, only
// gate facts that no commit order of the recorded steps gives.
// Idempotent.
func (s *Stores) keepCommitOrder(cur *current) {
	if cur.facts == nil || !s.Horizon.IsZero() { // before a horizon: keepBeforeHorizon
		return
	}
	for typ, g := range s.steps {
		live, b := cur.facts[typ], s.Trust[typ]
		if live != nil && b != nil && g.allows(*live) {
			b.BlockStreak, b.Gates = live.BlockStreak, live.Gates
		}
	}
}

// allows reports whether gate facts live may be what the steps g give in
// some commit order: the live marks, in the order the gate committed them,
// are exactly the steps' (the newest trust.GateMemory of them once the
// gate forgot the oldest), each with the answer its event recorded; and
// the live streak is the blocks committed after the newest probe — fewer
// when a trusted pass may have reset it since (a reset leaves no mark), a
// count of its own when the oldest marks are forgotten and none of the
// rest is a probe.
func (g *gateSteps) allows(live trust.Stats) bool {
	if len(live.Gates) != min(len(g.marks), trust.GateMemory) {
		return false
	}
	seen := make(map[string]bool, len(live.Gates))
	blocks, known := 0, len(g.marks) <= trust.GateMemory
	for _, m := range live.Gates {
		probe, ok := g.marks[m.Key]
		if !ok || probe != m.Probe || seen[m.Key] {
			return false
		}
		seen[m.Key] = true
		if m.Probe {
			blocks, known = 0, true
		} else {
			blocks++
		}
	}
	switch {
	case live.BlockStreak < 0:
		return false
	case g.resets > 0 && (live.BlockStreak <= blocks || !known):
		return true
	case known:
		return live.BlockStreak == blocks
	}
	return live.BlockStreak >= blocks
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
		return textcut.Clip(side(lk, lo), shown), textcut.Clip(side(bk, bo), shown)
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
		return textcut.Clip("in the order "+strings.Join(keys, " "), shown)
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

// shown is how many bytes of a value a Difference shows.
const shown = 200

func clip(b json.RawMessage) string {
	s := string(b)
	if s == "" {
		s = "(none)"
	}
	return textcut.Clip(s, shown)
}
