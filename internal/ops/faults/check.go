package faults

import (
	"context"
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
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Call is one request the scripted model received.
type Call struct {
	// Instance is the executor instance that sent it.
	Instance string
	Task     string
	// Pass and Attempt are the run the prompt was built for.
	Pass, Attempt int
	// Answer is the letter answered (AnswerTransient for a 503).
	Answer byte
	Status int
	// TokensIn and TokensOut are what a 200 answer billed.
	TokensIn, TokensOut int
	Start               time.Time
	// Answered is false when the caller went away before the answer was
	// written: a kill mid-call.
	Answered bool
}

// final reports whether the call got an answer that ends an attempt (not
// a transient error).
func (c Call) final() bool { return c.Answered && c.Answer != AnswerTransient }

// Disruption is one fault the suite caused.
type Disruption struct {
	What string
	// Instance is the process it hit; "" for the whole mesh (a server
	// restart, a stream leader shut down, SIGTERM of everything).
	Instance string
	At       time.Time
}

// Input is what the checker holds the mesh's stores to.
type Input struct {
	// JS sees every stream and bucket (the admin user).
	JS jetstream.JetStream
	// Policy is the policy the mesh ran with; Scoring its trust scoring.
	Policy  *policy.Source
	Scoring trust.Policy
	// Tasks are the tasks submitted (their publish acknowledged), with the
	// plan the model followed for each.
	Tasks map[string]Plan
	// Calls returns every request the model received so far: Check reads
	// it with the stores.
	Calls func() []Call
	// Stopped says no service of the mesh runs: Check reads it once.
	Stopped bool
	// Disruptions are the faults caused, for explaining repeated calls.
	Disruptions []Disruption
	// Slack is how long before a call a disruption may have happened and
	// still be why it was repeated or cut short (a connection that was
	// down, a redelivery after AckWait).
	Slack time.Duration
	// Faults counts the faults caused, by kind, for the report.
	Faults map[string]int
}

// Problem is one way the stores break an invariant.
type Problem struct {
	Task   string // "" for a type or a store
	Kind   string
	Detail string
}

func (p Problem) String() string {
	if p.Task == "" {
		return p.Kind + ": " + p.Detail
	}
	return fmt.Sprintf("%s: task %s: %s", p.Kind, p.Task, p.Detail)
}

// Problem kinds.
const (
	KindLost       = "lost"       // submitted, then nothing: no event, no state
	KindStranded   = "stranded"   // never reached a terminal state
	KindDuplicated = "duplicated" // an outcome (terminal record, attempt, history entry) twice
	KindState      = "state"      // the task state disagrees with the stream
	KindAttempts   = "attempts"   // not the attempts the model's answers imply
	KindCalls      = "calls"      // model calls and recorded outcomes disagree
	KindRepeat     = "repeat"     // a model call repeated or cut short with no fault to explain it
	KindHistory    = "history"    // a subject's history record is not its newest attempts, one entry each
	KindDrift      = "drift"      // trust outcomes or daily spend differ from the recorded outcomes
	KindRebuild    = "rebuild"    // dispatch rebuild disagrees with the live stores
	KindUnknown    = "unknown"    // a task nobody submitted
)

// Report is what Check found.
type Report struct {
	Submitted, Terminal, Lost, Duplicated, Stranded int
	// Held counts tasks held for their type's trust at the end: settled,
	// neither terminal nor stranded.
	Held int
	// Ends counts the tasks by how they ended.
	Ends map[string]int
	// Attempts is every attempt recorded; Admitted the passes the gate
	// let through, by cause.
	Attempts int
	Admitted map[string]int
	// Faults counts the faults caused, by kind; Kills the SIGKILLs among them.
	Faults map[string]int
	Kills  int
	// Redeliveries counts deliveries beyond a message's first, per durable.
	Redeliveries map[string]int
	// ModelCalls is every request the model received: Repeated were
	// answered for a pass already answered (a kill between the call and its
	// publish), CutShort lost their caller mid-call, Transient were 503s.
	ModelCalls, Repeated, CutShort, Transient int
	// CounterDrift counts the ways the outcome stream (each type's trust)
	// or the daily spend differ from the recorded outcomes.
	CounterDrift int
	// RebuildDiffs counts the differences dispatch rebuild finds.
	RebuildDiffs int
	// Events is how many messages the stream holds.
	Events int
	// Moved lists what moved during each earlier read of the mesh (Check
	// read again): the last sequences of the streams that changed.
	Moved    []string
	Problems []Problem
}

// OK reports whether every invariant held.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "submitted %d, terminal %d, held %d, lost %d, duplicated %d, stranded %d\n",
		r.Submitted, r.Terminal, r.Held, r.Lost, r.Duplicated, r.Stranded)
	fmt.Fprintf(&b, "  ended: %s; %d attempts, %d events on the stream\n", counts(r.Ends), r.Attempts, r.Events)
	fmt.Fprintf(&b, "  gate let through: %s\n", counts(r.Admitted))
	fmt.Fprintf(&b, "  kills %d; faults: %s\n", r.Kills, counts(r.Faults))
	total := 0
	for _, n := range r.Redeliveries {
		total += n
	}
	fmt.Fprintf(&b, "  redeliveries %d (%s)\n", total, countsOrdered(r.Redeliveries, Durables))
	fmt.Fprintf(&b, "  model calls %d: repeated %d (a kill between the call and its publish), cut short %d (a kill mid-call), transient %d\n",
		r.ModelCalls, r.Repeated, r.CutShort, r.Transient)
	fmt.Fprintf(&b, "  counter drift %d, rebuild differences %d, problems %d\n", r.CounterDrift, r.RebuildDiffs, len(r.Problems))
	for i, m := range r.Moved {
		fmt.Fprintf(&b, "  read %d of the mesh discarded: it moved while read (%s)\n", i+1, m)
	}
	return b.String()
}

func counts(m map[string]int) string {
	return countsOrdered(m, slices.Sorted(maps.Keys(m)))
}

func countsOrdered(m map[string]int, order []string) string {
	var parts []string
	for _, k := range order {
		if n, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// checker holds what Check read.
type checker struct {
	in     Input
	v      *streamView
	states map[string]events.TaskState
	// records are the history bucket's, by key (history.Key).
	records map[string]history.Record
	calls   map[string]map[int][]Call // by task and pass, in arrival order
	r       *Report
}

func (c *checker) problem(task, kind, format string, args ...any) {
	c.r.Problems = append(c.r.Problems, Problem{Task: task, Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// Check reads the stream, the task and history buckets, the outcome
// stream, the spend counters and the stage consumers, and holds them to
// the invariants of a mesh that lost nothing and did nothing twice,
// whatever faults it went through:
//
//   - every submitted task reached exactly one terminal record, and its
//     state agrees with it;
//   - it made the attempts the model's answers imply (a gate may stop it
//     earlier), each attempt once, with the outcome the model answered;
//   - each (type, subject)'s history record holds the newest history.Keep
//     of its attempts (and of its failed ones) by (At, Key), in that
//     order, each once;
//   - every model call's pass has its outcome, and a pass answered twice
//     (or a call cut short) has a fault to explain it;
//   - each type's outcomes on the outcome stream and its daily spend equal
//     what its recorded outcomes imply;
//   - dispatch rebuild, replaying the stream, agrees with the live stores.
//
// A mesh that runs must be idle (see Idle) for the result to mean
// anything, and an idle mesh still moves now and then: the gate's sweeper
// re-admits a held pass when its type recovers, and that pass runs to its
// end. Check reads the stream, the stores and the model's ledger one after
// the other, so a pass that moved in between would show as a difference
// no fault caused. Unless in.Stopped, a read counts only when the mesh was
// idle as it began and nothing was written to what it reads until it
// ended (see fingerprint); otherwise Check reads again, up to MaxReads
// times, as long as ctx lets it.
func Check(ctx context.Context, in Input) (*Report, error) {
	if in.Stopped {
		return check(ctx, in, in.Calls())
	}
	var discarded []string
	for reads := 0; ; {
		before, err := fingerprint(ctx, in.JS)
		if err != nil {
			return nil, err
		}
		idle, busy, err := Idle(ctx, in.JS)
		if err != nil {
			return nil, err
		}
		why := "busy: " + busy
		if idle {
			reads++
			rep, err := check(ctx, in, in.Calls())
			if err != nil {
				return nil, err
			}
			after, err := fingerprint(ctx, in.JS)
			if err != nil {
				return nil, err
			}
			if why = moved(before, after); why == "" {
				rep.Moved = discarded
				return rep, nil
			}
			discarded = append(discarded, why)
			if reads >= MaxReads {
				return nil, fmt.Errorf("check: the mesh moved during each of %d reads (the last: %s)", reads, why)
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("check: the mesh did not stand still (%s): %w", why, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// MaxReads is how many reads of a running mesh Check makes at most before
// it gives up on the mesh standing still.
const MaxReads = 20

// check is one read of the mesh and the invariants held to it.
func check(ctx context.Context, in Input, calls []Call) (*Report, error) {
	c := &checker{in: in, calls: map[string]map[int][]Call{}, r: &Report{
		Submitted: len(in.Tasks), Ends: map[string]int{}, Faults: in.Faults,
	}}
	var err error
	if c.v, err = readStream(ctx, in.JS); err != nil {
		return nil, err
	}
	c.r.Events, c.r.Admitted = c.v.msgs, c.v.admitted
	if c.states, err = readBucket[events.TaskState](ctx, in.JS, services.BucketTasks); err != nil {
		return nil, err
	}
	windows, err := readOutcomes(ctx, in.JS)
	if err != nil {
		return nil, err
	}
	outcomeCopies, err := copies(ctx, in.JS, services.OutcomeStream)
	if err != nil {
		return nil, err
	}
	if c.records, err = readBucket[history.Record](ctx, in.JS, services.BucketHistory); err != nil {
		return nil, err
	}
	if c.r.Redeliveries, err = redeliveries(ctx, in.JS, c.v); err != nil {
		return nil, err
	}
	for kind, n := range in.Faults {
		if strings.HasPrefix(kind, "kill") {
			c.r.Kills += n
		}
	}
	c.r.ModelCalls = len(calls)
	for _, call := range calls {
		byPass := c.calls[call.Task]
		if byPass == nil {
			byPass = map[int][]Call{}
			c.calls[call.Task] = byPass
		}
		byPass[call.Pass] = append(byPass[call.Pass], call)
		if call.Answer == AnswerTransient {
			c.r.Transient++
		}
		if _, ok := in.Tasks[call.Task]; !ok {
			c.problem(call.Task, KindCalls, "the model was called for a task nobody submitted")
		}
	}

	for _, id := range slices.Sorted(maps.Keys(in.Tasks)) {
		c.task(id, in.Tasks[id])
	}
	for _, id := range slices.Sorted(maps.Keys(c.states)) {
		if _, ok := in.Tasks[id]; !ok {
			c.problem(id, KindUnknown, "a task state for a task nobody submitted (status %s)", c.states[id].Status)
		}
	}
	c.histories()
	if err := c.trust(ctx, windows, outcomeCopies); err != nil {
		return nil, err
	}
	if err := c.rebuild(ctx); err != nil {
		return nil, err
	}
	return c.r, nil
}

// task checks one submitted task.
func (c *checker) task(id string, plan Plan) {
	te := c.v.tasks[id]
	if te == nil {
		te = newTaskEvents()
	}
	st, hasState := c.states[id]
	if te.queued == 0 && !hasState {
		c.r.Lost++
		c.problem(id, KindLost, "submitted (publish acknowledged, %d on the stream) but never queued and no task state", te.submits)
		return
	}
	if !hasState {
		c.problem(id, KindState, "queued but no task state")
	}
	switch {
	case te.indexed == 0:
		c.problem(id, KindState, "queued but not in the task index (dispatch.index.>)")
	case te.indexed > 1:
		c.r.Duplicated++
		c.problem(id, KindDuplicated, "%d entries in the task index", te.indexed)
	}

	end := c.ending(id, te, st, hasState)

	executed := c.attempts(id, te)
	n := len(executed)
	c.r.Attempts += n

	// The model answered each attempt as planned, and the state recorded it.
	for _, ex := range executed {
		want, class := Outcome(plan.Answer(ex.Run.Attempt))
		if ex.Result.Refused || ex.Result.Outcome != want || ex.Result.ErrorClass != class {
			c.problem(id, KindAttempts, "attempt %d (pass %d): the model answered %c, the outcome is %s/%s (refused %v)",
				ex.Run.Attempt, ex.Run.Pass, plan.Answer(ex.Run.Attempt), ex.Result.Outcome, ex.Result.ErrorClass, ex.Result.Refused)
		}
	}
	if hasState {
		c.state(id, st, end, executed)
	}

	// The attempts the plan implies: all of them, unless the gate stopped
	// the task early.
	t := events.Task{ID: id, Type: st.Type}
	if n > 0 {
		t = executed[0].Task
	}
	maxRetries := task.MaxRetries(t, c.in.Policy.For(t.Type))
	want, succeeds := plan.Expect(maxRetries)
	switch {
	case len(te.endings) == 0:
	case end.Kind == EndSucceeded:
		if !succeeds || n != want {
			c.problem(id, KindAttempts, "succeeded after %d attempts; plan %s succeeds at attempt %d", n, plan, want)
		}
	case end.Kind == EndEscalated && end.Cause == "":
		if succeeds || n != want {
			c.problem(id, KindAttempts, "handed off after %d attempts; plan %s ends after %d (success %v)", n, plan, want, succeeds)
		}
	case end.Kind == EndGated || end.Kind == EndEscalated:
		if n >= want {
			c.problem(id, KindAttempts, "the gate stopped it (%s) after %d attempts; plan %s ends after %d", end, n, plan, want)
		}
	default:
		c.problem(id, KindAttempts, "ended %s; nothing in this workload ends so", end)
	}

	c.modelCalls(id, te, executed)
}

// ending is how task id ended (its first terminal record; none while it
// is held or stranded), counted in the report.
func (c *checker) ending(id string, te *taskEvents, st events.TaskState, hasState bool) ending {
	var end ending
	switch {
	case len(te.endings) == 0 && hasState && st.Status == events.StatusHeld && te.held > 0:
		// Held for its type's trust: settled, not stranded — it sleeps in
		// the held index until its type recovers or its hold time runs out
		// (SPEC §2); the rebuild comparison reports a held pass without
		// its entry.
		c.r.Held++
	case len(te.endings) == 0:
		c.r.Stranded++
		c.problem(id, KindStranded, "no terminal record: state %s at pass %d after %d attempts (reason %q); events %s",
			st.Status, st.Pass, st.Attempts, st.Reason, strings.Join(te.trail, " "))
	default:
		c.r.Terminal++
		end = te.endings[0]
		if len(te.endings) > 1 {
			c.r.Duplicated++
			c.problem(id, KindDuplicated, "%d terminal records: %v; events %s", len(te.endings), te.endings, strings.Join(te.trail, " "))
		}
		label := end.Kind
		if end.Cause == events.CauseRungRate {
			label = endRungRate
		}
		c.r.Ends[label]++
	}
	return end
}

// attempts are the Executed events of task id, one per pass in pass
// order: each pass must have one, and run the next attempt.
func (c *checker) attempts(id string, te *taskEvents) []events.Executed {
	passes := slices.Sorted(maps.Keys(te.executed))
	var executed []events.Executed
	byAttempt := map[int]int{}
	for i, pass := range passes {
		evs := te.executed[pass]
		if len(evs) > 1 {
			c.problem(id, KindDuplicated, "pass %d has %d executed events", pass, len(evs))
		}
		ex := evs[0]
		if prev, ok := byAttempt[ex.Run.Attempt]; ok {
			c.problem(id, KindDuplicated, "attempt %d executed twice (passes %d and %d)", ex.Run.Attempt, prev, pass)
		} else if ex.Run.Attempt != i+1 {
			c.problem(id, KindAttempts, "pass %d ran attempt %d, expected attempt %d", pass, ex.Run.Attempt, i+1)
		}
		byAttempt[ex.Run.Attempt] = pass
		executed = append(executed, ex)
	}
	return executed
}

// endStatus is the task status each terminal record leaves.
var endStatus = map[string]events.Status{
	EndSucceeded: events.StatusSucceeded,
	EndCancelled: events.StatusCancelled,
	EndGated:     events.StatusNeedsHumanReview,
	EndEscalated: events.StatusBlocked,
	EndStuck:     events.StatusBlocked,
}

// state compares the task state with the stream.
func (c *checker) state(id string, st events.TaskState, end ending, executed []events.Executed) {
	if want, ok := endStatus[end.Kind]; ok && st.Status != want {
		c.problem(id, KindState, "status %s, but the stream ended it %s", st.Status, end)
	}
	if st.Attempts != len(executed) {
		c.problem(id, KindState, "state counts %d attempts, the stream has %d", st.Attempts, len(executed))
	}
	// The state keeps the newest records of earlier rounds only.
	kept := executed[len(executed)-min(len(executed), len(st.History)):]
	if want := len(task.KeptAttempts(records(executed), st.RoundStart)); len(st.History) != want {
		c.problem(id, KindState, "state records %d attempts, the stream has %d of which it keeps %d", len(st.History), len(executed), want)
		return
	}
	for i, rec := range st.History {
		ex := kept[i]
		if rec.Pass != ex.Run.Pass || rec.Attempt != ex.Run.Attempt || rec.Outcome != ex.Result.Outcome ||
			rec.TokensIn != ex.Result.TokensIn || rec.TokensOut != ex.Result.TokensOut {
			c.problem(id, KindState, "attempt record %d is pass %d attempt %d %s (%d/%d tokens), the stream has pass %d attempt %d %s (%d/%d tokens)",
				i+1, rec.Pass, rec.Attempt, rec.Outcome, rec.TokensIn, rec.TokensOut,
				ex.Run.Pass, ex.Run.Attempt, ex.Result.Outcome, ex.Result.TokensIn, ex.Result.TokensOut)
		}
	}
}

// records are the attempt records executed would make, as far as
// task.KeptAttempts reads them.
func records(executed []events.Executed) []events.AttemptRecord {
	out := make([]events.AttemptRecord, len(executed))
	for i, ex := range executed {
		out[i] = events.AttemptRecord{Pass: ex.Run.Pass, Attempt: ex.Run.Attempt}
	}
	return out
}

// modelCalls holds the model's calls for a task to its recorded attempts.
func (c *checker) modelCalls(id string, te *taskEvents, executed []events.Executed) {
	byPass := c.calls[id]
	for _, pass := range slices.Sorted(maps.Keys(byPass)) {
		calls := byPass[pass]
		if _, ok := te.executed[pass]; !ok {
			c.problem(id, KindCalls, "the model was called %d times for pass %d, which has no outcome", len(calls), pass)
		}
		var answered []Call
		for _, call := range calls {
			switch {
			case !call.Answered:
				c.r.CutShort++
				if !c.explained(call.Instance, call.Start.Add(-c.in.Slack), call.Start.Add(c.in.Slack)) {
					c.problem(id, KindRepeat, "a call for pass %d from %s at %s was cut short with no fault near it",
						pass, call.Instance, call.Start.Format(time.RFC3339Nano))
				}
			case call.final():
				answered = append(answered, call)
			}
		}
		for i := 1; i < len(answered); i++ {
			c.r.Repeated++
			prev, next := answered[i-1], answered[i]
			if !c.explained(prev.Instance, prev.Start.Add(-c.in.Slack), next.Start) {
				c.problem(id, KindRepeat, "pass %d answered twice (%s at %s, then %s at %s) with no fault between",
					pass, prev.Instance, prev.Start.Format(time.RFC3339Nano), next.Instance, next.Start.Format(time.RFC3339Nano))
			}
		}
	}
	for _, ex := range executed {
		var answered []Call
		for _, call := range byPass[ex.Run.Pass] {
			if call.final() {
				answered = append(answered, call)
			}
		}
		if len(answered) == 0 {
			c.problem(id, KindCalls, "attempt %d (pass %d) has an outcome but the model never answered it", ex.Run.Attempt, ex.Run.Pass)
			continue
		}
		if !slices.ContainsFunc(answered, func(call Call) bool {
			return call.Attempt == ex.Run.Attempt && call.TokensIn == ex.Result.TokensIn && call.TokensOut == ex.Result.TokensOut
		}) {
			c.problem(id, KindCalls, "attempt %d (pass %d) recorded %d/%d tokens; no answer of the model for it billed that",
				ex.Run.Attempt, ex.Run.Pass, ex.Result.TokensIn, ex.Result.TokensOut)
		}
	}
}

// explained reports whether a fault hit instance (or the whole mesh)
// between from and to.
func (c *checker) explained(instance string, from, to time.Time) bool {
	for _, d := range c.in.Disruptions {
		if (d.Instance == "" || d.Instance == instance) && !d.At.Before(from) && !d.At.After(to) {
			return true
		}
	}
	return false
}

// histories checks each (type, subject)'s history record against the
// attempts its tasks made that count for history (task.CountsForHistory:
// not an outage, a refusal or the deployment's fault). The record keeps the last history.Keep outcomes
// of a (type, subject), and apart the last Keep of its failures, each
// ordered by (At, Key) whatever order recorders appended them in
// (history.Record.Add): every entry kept is an attempt on the stream, of a
// task of that (type, subject), kept once and with the attempt's outcome;
// and what is kept is exactly the newest Keep of those attempts (and of
// the failed ones) by (At, Key), oldest first — At being when the stream
// stored the attempt's executed event, as the recorder dates it — so
// every attempt is there until Keep newer ones replace it.
func (c *checker) histories() {
	attempts := map[string]history.Entry{} // by key
	implied := map[string]*history.Record{}
	for _, id := range slices.Sorted(maps.Keys(c.v.tasks)) {
		te := c.v.tasks[id]
		for _, pass := range slices.Sorted(maps.Keys(te.executed)) {
			ex := te.executed[pass][0] // a second executed event is a problem of its own
			judged := c.judged(id, ex)
			if !task.CountsForHistory(judged) { // an outage, a refusal, the deployment's fault
				continue
			}
			e := history.Entry{Key: services.MsgID(id, pass, "outcome"), TaskID: id, Attempt: ex.Run.Attempt,
				Outcome: judged.Outcome, At: te.executedAt[pass]}
			attempts[e.Key] = e
			k := history.Key(ex.Task.Type, ex.Task.Subject)
			rec := implied[k]
			if rec == nil {
				rec = &history.Record{Type: ex.Task.Type, Subject: ex.Task.Subject}
				implied[k] = rec
			}
			*rec, _ = rec.Add(e)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(union(implied, c.records))) {
		want, kept := implied[k], c.records[k]
		if want == nil {
			want = &history.Record{}
		}
		where := fmt.Sprintf("%s %q", want.Type, want.Subject)
		if want.Type == "" {
			where = fmt.Sprintf("%s %q", kept.Type, kept.Subject)
		}
		if _, ok := c.records[k]; ok && history.Key(kept.Type, kept.Subject) != k {
			c.problem("", KindHistory, "the record under %s says it is the history of %s %q, whose key is %s",
				k, kept.Type, kept.Subject, history.Key(kept.Type, kept.Subject))
		}
		c.historyKind(where, "outcomes", kept.Outcomes, want.Outcomes, attempts)
		c.historyKind(where, "failures", kept.Failures, want.Failures, attempts)
	}
}

// historyKind compares the entries of one kind a (type, subject)'s record
// keeps with the newest of its attempts (want), both oldest first.
func (c *checker) historyKind(where, kind string, kept, want []history.Entry, attempts map[string]history.Entry) {
	has := func(entries []history.Entry, key string) bool {
		return slices.ContainsFunc(entries, func(e history.Entry) bool { return e.Key == key })
	}
	times := map[string]int{}
	for _, e := range kept {
		times[e.Key]++
	}
	seen := map[string]bool{}
	for _, e := range kept {
		if seen[e.Key] {
			continue
		}
		seen[e.Key] = true
		if n := times[e.Key]; n > 1 { // Record.Add never keeps a key twice: written by hand
			c.r.Duplicated++
			c.problem(e.TaskID, KindDuplicated, "history entry %s is kept %d times among the %s of %s", e.Key, n, kind, where)
		}
		a, ok := attempts[e.Key]
		switch {
		case !ok:
			c.problem(e.TaskID, KindHistory, "history entry %s among the %s of %s has no attempt on the stream", e.Key, kind, where)
		case !has(want, e.Key):
			c.problem(e.TaskID, KindHistory, "history entry %s is kept among the %s of %s, but is not one of its newest %d attempts there (the newest: %s)",
				e.Key, kind, where, history.Keep, keyList(want))
		case e.Attempt != a.Attempt || e.Outcome != a.Outcome || !e.At.Equal(a.At):
			c.problem(e.TaskID, KindHistory, "history entry %s says attempt %d %s at %s; the stream has attempt %d %s, executed at %s",
				e.Key, e.Attempt, e.Outcome, e.At.Format(time.RFC3339Nano), a.Attempt, a.Outcome, a.At.Format(time.RFC3339Nano))
		}
	}
	missing := false
	for _, e := range want {
		if !has(kept, e.Key) {
			missing = true
			c.problem(e.TaskID, KindHistory, "attempt %s has no history entry among the %s of %s, of which it is one of the newest %d (kept: %s)",
				e.Key, kind, where, history.Keep, keyList(kept))
		}
	}
	// The same entries, each once, in another order: the record is not
	// ordered by (At, Key).
	if !missing && len(kept) == len(want) && keyList(kept) != keyList(want) {
		c.problem("", KindHistory, "the %s of %s are kept in the order %s, not by (At, Key): %s", kind, where, keyList(kept), keyList(want))
	}
}

// judged is the outcome and class the recorder recorded for the attempt of
// ex (the task state's record of its pass), or else the Result it was
// executed with.
func (c *checker) judged(id string, ex events.Executed) events.Result {
	for _, rec := range c.states[id].History {
		if rec.Pass == ex.Run.Pass {
			return events.Result{Outcome: rec.Outcome, ErrorClass: rec.ErrorClass}
		}
	}
	return ex.Result
}

func keyList(entries []history.Entry) string {
	if len(entries) == 0 {
		return "none"
	}
	ks := make([]string, len(entries))
	for i, e := range entries {
		ks[i] = e.Key
	}
	return strings.Join(ks, " ")
}

func lastN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func union[A, B any](a map[string]A, b map[string]B) map[string]bool {
	all := map[string]bool{}
	for k := range a {
		all[k] = true
	}
	for k := range b {
		all[k] = true
	}
	return all
}
