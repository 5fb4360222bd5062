package gate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/gate"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// meshGate is the gate running both its consumers under routers, with the
// held index and its sweeper, on a real clock.
type meshGate struct {
	t      *testing.T
	js     jetstream.JetStream
	view   *trust.View
	tasks  *services.TaskStore
	index  *services.HeldIndex
	stream jetstream.Stream
}

// startGate runs the gate with maxAckPending on each of its consumers.
func startGate(t *testing.T, scoring trust.Policy, maxAckPending int) *meshGate {
	t.Helper()
	return startGateWith(t, scoring, maxAckPending, 3, 0)
}

// startGateWith is startGate with the gate's Readmit and MaxBacklog.
func startGateWith(t *testing.T, scoring trust.Policy, maxAckPending, readmit, maxBacklog int) *meshGate {
	t.Helper()
	srv := natstest.Start(t)
	ctx := t.Context()
	stores, err := services.Provision(ctx, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m := &meshGate{t: t, js: srv.JS, tasks: services.NewTaskStore(stores.Tasks), index: services.NewHeldIndex(stores.Held)}
	if m.view, err = trust.NewView(ctx, srv.JS, stores.Trust, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.view.Stop)
	if m.stream, err = srv.JS.Stream(ctx, services.Stream); err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{View: m.view, Trust: trust.NewStore(stores.Trust, scoring), Tasks: m.tasks,
		Held: m.index, JS: srv.JS, Policy: policy.Static(nil), Scoring: scoring,
		SweepEvery: 20 * time.Millisecond, Readmit: readmit, MaxBacklog: maxBacklog, Instance: "gate@test", Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, 3)
	for _, spec := range []services.Spec{g.Spec(), g.HeldSpec(), g.WakeSpec()} {
		spec.MaxAckPending = maxAckPending
		r := &services.Router{JS: srv.JS, Instance: "gate@test", Log: quiet, Grace: time.Second}
		go func() {
			defer func() { done <- struct{}{} }()
			if err := r.Run(rctx, spec); err != nil {
				t.Error(err)
			}
		}()
	}
	t.Cleanup(func() { stop(); <-done; <-done; <-done })
	return m
}

// submit publishes a verified first pass of task id of typ, its state
// created, as the verifier would.
func (m *meshGate) submit(id, typ string) {
	m.t.Helper()
	m.submitRun(id, typ, first())
}

// outcomes publishes n ended tasks of typ, successes or failures, now.
func (m *meshGate) outcomes(typ string, n int, success bool, tag string) {
	m.t.Helper()
	for i := range n {
		key := fmt.Sprintf("%s-%s-%d", typ, tag, i)
		msg, err := trust.OutcomeMsg(typ, trust.Outcome{Key: key, Task: key, Success: success, End: true, At: time.Now().UTC()})
		if err != nil {
			m.t.Fatal(err)
		}
		if _, err := m.js.PublishMsg(context.Background(), msg); err != nil {
			m.t.Fatal(err)
		}
	}
}

// readmitted records the end of task id, a held task of typ the gate
// re-admitted, as the recorder would: its outcome, and its status.
func (m *meshGate) readmitted(typ, id string, success bool) {
	m.t.Helper()
	msg, err := trust.OutcomeMsg(typ, trust.Outcome{Key: id + ":1:outcome", Task: id, Success: success, Held: true, End: true, At: time.Now().UTC()})
	if err != nil {
		m.t.Fatal(err)
	}
	if _, err := m.js.PublishMsg(context.Background(), msg); err != nil {
		m.t.Fatal(err)
	}
	status := events.StatusSucceeded
	if !success {
		status = events.StatusBlocked
	}
	if _, err := m.tasks.Update(context.Background(), id, func(st *events.TaskState, _ bool) error {
		st.Status = status
		return nil
	}); err != nil && !errors.Is(err, services.ErrTaskNotFound) {
		m.t.Fatal(err)
	}
}

// stage lists, in stream order, the tasks with an event on stage.
func (m *meshGate) stage(stage string) []string {
	m.t.Helper()
	c, err := m.stream.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.StageFilter(stage)}})
	if err != nil {
		m.t.Fatal(err)
	}
	// Deleted once read: a test polling for a minute would otherwise fill
	// the stream's consumer limit with idle ones.
	defer func() {
		if info := c.CachedInfo(); info != nil {
			_ = m.stream.DeleteConsumer(context.Background(), info.Name)
		}
	}()
	var ids []string
	for {
		batch, err := c.FetchNoWait(500)
		if err != nil {
			m.t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			id, _, _ := events.ParseTaskSubject(msg.Subject())
			ids = append(ids, id)
		}
		if n == 0 {
			return ids
		}
	}
}

// asleep is the held index's entries, oldest first within a type.
func (m *meshGate) asleep() []services.HeldEntry {
	m.t.Helper()
	keys, err := m.index.KV().ListKeys(context.Background())
	if err != nil {
		m.t.Fatal(err)
	}
	var all []services.HeldEntry
	for key := range keys.Keys() {
		e, err := m.index.KV().Get(context.Background(), key)
		if err != nil {
			continue // gone meanwhile
		}
		entry, err := services.DecodeHeldEntry(key, e.Value())
		if err != nil {
			m.t.Fatal(err)
		}
		all = append(all, entry)
	}
	slices.SortFunc(all, func(a, b services.HeldEntry) int { return a.Since.Compare(b.Since) })
	return all
}

// stageOf is which of ids have published an event at stage.
func (m *meshGate) stageOf(stage string, ids []string) []string {
	var out []string
	for _, id := range m.stage(stage) {
		if slices.Contains(ids, id) && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// pending is how many messages a consumer has delivered and not seen acked.
func (m *meshGate) pending(durable string) int {
	m.t.Helper()
	c, err := m.js.Consumer(context.Background(), services.Stream, durable)
	if err != nil {
		m.t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		m.t.Fatal(err)
	}
	return info.NumAckPending
}

// eventually fails the test unless ok holds within a minute.
func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Passes held for trust sleep in the held index, not in the held
// consumer's pending slots: with every consumer allowed 4 pending
// messages, 12 held passes of a gated type leave a new type's waiting
// passes their slots, and once the type recovers the sweeper wakes the
// held ones oldest first, a few per sweep, and every one is admitted.
func TestHeldPassesSleepInTheIndexAndComeBackOldestFirst(t *testing.T) {
	// No probe while the test runs: the type stays held until it recovers.
	scoring := trust.Policy{ProbeAfter: 1000, ProbeInterval: time.Hour, PriorWeight: -1}
	m := startGate(t, scoring, 4)
	m.outcomes("gated", 10, false, "before")
	eventually(t, "the view holds the outcomes", func() bool { return len(m.view.Stats("gated").Outcomes) == 10 })

	var held []string
	for i := range 12 {
		id := fmt.Sprintf("held-%02d", i)
		m.submit(id, "gated")
		held = append(held, id)
	}
	eventually(t, "12 passes asleep in the held index", func() bool { return len(m.asleep()) == 12 })
	eventually(t, "no pending message in the held consumer", func() bool { return m.pending(services.ConsumerGateHeld) == 0 })
	// Wakes come on a consumer of their own: none is due yet.
	if n := m.pending(services.ConsumerGateWake); n != 0 {
		t.Fatalf("%d wakes pending while the type is below and no probe is due", n)
	}
	for _, id := range held {
		if st, err := m.tasks.Get(context.Background(), id); err != nil || st.Status != events.StatusHeld {
			t.Fatalf("%s: status %s (%v), want held", id, st.Status, err)
		}
	}
	order := m.asleep()

	// A new type's burst: its canaries go, the others wait for their
	// evidence asleep in the held index too — no consumer keeps their
	// messages — and the sweeper wakes them as canaries end and once the
	// canaries scored the type.
	var fresh []string
	for i := range 15 {
		id := fmt.Sprintf("fresh-%02d", i)
		m.submit(id, "fresh")
		fresh = append(fresh, id)
	}
	waiting := func() (n int) {
		for _, e := range m.asleep() {
			if e.Type == "fresh" && e.Canary() {
				n++
			}
		}
		return n
	}
	eventually(t, "the new type's passes past its canaries asleep, waiting for them", func() bool {
		return waiting() == 15-len(m.stageOf(events.StageAdmitted, fresh))
	})
	if n := waiting(); n < 15-canaries {
		t.Fatalf("%d of the new type's passes asleep while its canaries run, want at least %d", n, 15-canaries)
	}
	eventually(t, "no pending message in the held consumer", func() bool { return m.pending(services.ConsumerGateHeld) == 0 })
	ended := map[string]bool{}
	eventually(t, "every task of the new type admitted", func() bool {
		admitted := 0
		for _, id := range m.stage(events.StageAdmitted) {
			if !slices.Contains(fresh, id) {
				continue
			}
			admitted++
			if !ended[id] { // the canary succeeds, as the recorder would record it
				ended[id] = true
				msg, _ := trust.OutcomeMsg("fresh", trust.Outcome{Key: id + ":1:outcome", Task: id, Success: true, End: true, At: time.Now().UTC()})
				if _, err := m.js.PublishMsg(context.Background(), msg); err != nil {
					t.Fatal(err)
				}
				if _, err := m.tasks.Update(context.Background(), id, func(st *events.TaskState, _ bool) error {
					st.Status = events.StatusSucceeded
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
		return admitted == len(fresh)
	})
	if got := len(m.asleep()); got != 12 {
		t.Fatalf("%d passes asleep after the new type's burst, want the 12 held", got)
	}

	// The gated type recovers: every held pass comes back, oldest first,
	// a few at a time while the re-admitted ones succeed (recorded here as
	// the recorder would).
	m.outcomes("gated", 40, true, "after")
	recorded := map[string]bool{}
	eventually(t, "every held pass admitted and its entry gone", func() bool {
		n := 0
		for _, id := range m.stage(events.StageAdmitted) {
			if !slices.Contains(held, id) {
				continue
			}
			n++
			if !recorded[id] {
				recorded[id] = true
				m.readmitted("gated", id, true)
			}
		}
		return n == len(held) && len(m.asleep()) == 0
	})
	var woken []string
	for _, id := range m.stage(events.StageWake) {
		if slices.Contains(held, id) && !slices.Contains(woken, id) {
			woken = append(woken, id)
		}
	}
	want := make([]string, len(order))
	for i, e := range order {
		want[i] = e.Task
	}
	if !slices.Equal(woken, want) {
		t.Fatalf("woken in the order %v, want oldest first %v", woken, want)
	}
}

// A held backlog whose re-admitted tasks fail is read from its other end:
// after the type recovers its oldest two held passes come back (two trial
// places), and once one of them failed and the other succeeded, the
// sweeper wakes the rest newest first, four at a time.
func TestAFailingBacklogComesBackNewestFirst(t *testing.T) {
	scoring := trust.Policy{ProbeAfter: 1000, ProbeInterval: time.Hour, PriorWeight: -1}
	m := startGateWith(t, scoring, 100, 16, 0)
	m.outcomes("gated", 10, false, "before")
	eventually(t, "the view holds the outcomes", func() bool { return len(m.view.Stats("gated").Outcomes) == 10 })
	held := ids("held-", 8)
	for _, id := range held {
		m.submit(id, "gated")
		// One at a time, so that the index orders them as submitted.
		eventually(t, id+" asleep", func() bool {
			return slices.ContainsFunc(m.asleep(), func(e services.HeldEntry) bool { return e.Task == id })
		})
	}

	m.outcomes("gated", 40, true, "after")
	eventually(t, "the two oldest re-admitted", func() bool { return len(m.stageOf(events.StageAdmitted, held)) == 2 })
	if got := m.stageOf(events.StageAdmitted, held); !slices.Equal(slices.Sorted(slices.Values(got)), held[:2]) { // two looks at once: either order
		t.Fatalf("re-admitted first: %v, want the two oldest %v", got, held[:2])
	}
	m.readmitted("gated", held[0], false)
	m.readmitted("gated", held[1], true)
	eventually(t, "four more re-admitted", func() bool { return len(m.stageOf(events.StageAdmitted, held)) == 6 })
	var woken []string
	for _, id := range m.stage(events.StageWake) {
		if !slices.Contains(woken, id) {
			woken = append(woken, id)
		}
	}
	// A sweep may also wake passes whose looks leave them asleep, in the
	// order it judged then: before the view shows the trial places taken
	// (the oldest next), or after the four places are taken. Which of the
	// passes woken together takes a place is their looks' race. What the
	// sweeper decides is the order: the two oldest first, and from the
	// first wake after the re-admitted failure on, the newest first.
	if len(woken) < 2 || !slices.Equal(slices.Sorted(slices.Values(woken[:2])), held[:2]) {
		t.Fatalf("woken in the order %v, want the two oldest first", woken)
	}
	newest := slices.Index(woken, held[7])
	want := []string{held[7], held[6], held[5], held[4]}
	if newest < 0 || len(woken) < newest+len(want) || !slices.Equal(woken[newest:newest+len(want)], want) {
		t.Fatalf("woken in the order %v, want the oldest two, then newest first: %v", woken, want)
	}
}

// The sweeper feeds the executor no faster than it takes: held passes of
// a type that recovered are re-admitted while the executor's consumer has
// fewer than MaxBacklog messages waiting, so a flood never sits all at
// once in front of the executor. (No prompt builder nor executor runs
// here: the executor's consumer takes the admitted passes, and the test
// takes them off it.)
func TestSweeperBoundsTheExecutorsBacklog(t *testing.T) {
	const backlog = 4
	scoring := trust.Policy{ProbeAfter: 1000, ProbeInterval: time.Hour, PriorWeight: -1}
	const held = 16
	m := startGateWith(t, scoring, 100, held, backlog) // a sweep could re-admit them all
	ctx := t.Context()
	exec := m.modelQueue(ctx)
	m.outcomes("gated", 10, false, "before")
	eventually(t, "the view holds the outcomes", func() bool { return len(m.view.Stats("gated").Outcomes) == 10 })
	for i := range held {
		m.submit(fmt.Sprintf("held-%02d", i), "gated")
	}
	eventually(t, "every pass asleep", func() bool { return len(m.asleep()) == held })

	m.outcomes("gated", 40, true, "after")
	for i := range trust.DefaultMinOutcomes { // its held backlog proved itself: a sweep may wake them all
		m.readmitted("gated", fmt.Sprintf("cleared-%d", i), true)
	}
	most, taken := 0, 0
	eventually(t, "every held pass re-admitted through the executor's queue", func() bool {
		info, err := exec.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, int(info.NumPending))
		if info.NumPending >= backlog { // the executor takes what waits
			batch, err := exec.FetchNoWait(int(info.NumPending))
			if err != nil {
				t.Fatal(err)
			}
			for msg := range batch.Messages() {
				_ = msg.Ack()
				taken++
			}
		}
		return len(m.asleep()) == 0 && len(m.stageOf(events.StageAdmitted, ids("held-", held))) == held
	})
	// A look whose pass left the index but whose admission is not stored
	// yet is counted by neither: a sweep then may wake a few past the
	// bound, never the whole flood.
	if most > 2*backlog {
		t.Fatalf("the executor's consumer had %d messages waiting, want at most about %d", most, backlog)
	}
	if taken == 0 {
		t.Fatal("the backlog was never full: the test shows nothing")
	}
}

// ids is prefix00 … prefix<n-1>.
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

// A flood of a trusted type takes its turn: once the queue before the
// model is full, its first passes past its share sleep in the held index
// (waiting their turn), another type's pass still goes straight through,
// and as the queue drains the sleeping passes are woken and admitted.
func TestAFloodOfATrustedTypeTakesItsTurn(t *testing.T) {
	const backlog = 4
	scoring := trust.Policy{PriorWeight: -1}
	m := startGateWith(t, scoring, 100, 3, backlog)
	ctx := t.Context()
	exec := m.modelQueue(ctx)
	m.outcomes("busy", 20, true, "before")
	m.outcomes("calm", 20, true, "before")
	eventually(t, "the view holds the outcomes", func() bool {
		return len(m.view.Stats("busy").Outcomes) == 20 && len(m.view.Stats("calm").Outcomes) == 20
	})
	queued := func() (n int) {
		for _, e := range m.asleep() {
			if e.Hold == events.HoldQueued {
				n++
			}
		}
		return n
	}
	// The flood goes on until the gate queues its passes (the sweeper
	// must first have seen the queue full).
	var busy []string
	for i := 0; queued() == 0; i++ {
		if i >= 200 {
			t.Fatal("200 passes of a flooding type and none waited its turn")
		}
		id := fmt.Sprintf("busy-%03d", i)
		m.submit(id, "busy")
		busy = append(busy, id)
		if i >= backlog*2 {
			time.Sleep(20 * time.Millisecond) // a sweep's time: the flood goes on while the gate is busy
		}
	}
	m.submit("calm-0", "calm")
	eventually(t, "the other type's pass admitted while the flood waits", func() bool {
		return len(m.stageOf(events.StageAdmitted, []string{"calm-0"})) == 1
	})
	if queued() == 0 {
		t.Fatal("no flood pass waiting its turn when the other type's went through")
	}
	// The executor drains the queue: every flood pass is admitted in turn.
	eventually(t, "every flood pass admitted", func() bool {
		exec.drain(t)
		return queued() == 0 && len(m.stageOf(events.StageAdmitted, busy)) == len(busy)
	})
}

// modelQueue creates the consumers the sweeper reads the queue before the
// model from: the executor's takes the admitted passes (no prompt builder
// runs here), the prompt builder's takes nothing.
func (m *meshGate) modelQueue(ctx context.Context) queue {
	m.t.Helper()
	exec, err := m.js.CreateOrUpdateConsumer(ctx, services.Stream, jetstream.ConsumerConfig{Durable: services.ConsumerExecutor,
		FilterSubject: events.StageFilter(events.StageAdmitted), AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		m.t.Fatal(err)
	}
	if _, err := m.js.CreateOrUpdateConsumer(ctx, services.Stream, jetstream.ConsumerConfig{Durable: services.ConsumerPrompt,
		FilterSubject: events.StageFilter(events.StagePrompted), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		m.t.Fatal(err)
	}
	return queue{exec}
}

type queue struct{ jetstream.Consumer }

// drain takes and acks what waits on the queue.
func (q queue) drain(t *testing.T) {
	batch, err := q.FetchNoWait(100)
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		_ = msg.Ack()
	}
}

// A canary that ends with no outcome (cancelled as stale) keeps its place
// in the view until the canary TTL; the sweeper still wakes the oldest
// waiting pass now and then to look in full, which frees the place and
// takes it: the waiting passes do not wait the TTL out.
func TestCanaryPlacesOfCancelledTasksAreFreed(t *testing.T) {
	m := startGate(t, trust.Policy{PriorWeight: -1}, 100)
	var all []string
	for i := range canaries + 2 {
		id := fmt.Sprintf("fresh-%02d", i)
		m.submit(id, "fresh")
		all = append(all, id)
	}
	// Which passes take the places is the gate's race: read it back.
	var canaryIDs, waiting []string
	eventually(t, "the canaries admitted, the others asleep", func() bool {
		canaryIDs = m.stageOf(events.StageAdmitted, all)
		return len(canaryIDs) == canaries && len(m.asleep()) == 2
	})
	for _, id := range all {
		if !slices.Contains(canaryIDs, id) {
			waiting = append(waiting, id)
		}
	}
	for _, id := range canaryIDs { // cancelled: no outcome
		if _, err := m.tasks.Update(context.Background(), id, func(st *events.TaskState, _ bool) error {
			st.Status = events.StatusCancelled
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the waiting passes admitted", func() bool {
		return len(m.stageOf(events.StageAdmitted, waiting)) == len(waiting)
	})
}

// A burst of retries climbing onto a rung their type has no retry
// measured on: one climbs, the others wait asleep in the held index
// (status unchanged) for its outcome, then go on the rung's evidence.
func TestRetriesWaitForTheFirstOntoAnUnmeasuredRung(t *testing.T) {
	m, all := retriesOntoAnUnmeasuredRung(t, 3)
	var climbed string
	eventually(t, "one retry admitted, the others asleep waiting for its rung", func() bool {
		admitted := m.stageOf(events.StageAdmitted, all)
		asleep := m.asleep()
		if len(admitted) != 1 || len(asleep) != 2 {
			return false
		}
		for _, e := range asleep {
			if e.Hold != events.HoldRung || e.Rung != events.RungRefine || !e.Retry {
				t.Fatalf("asleep %+v, want a retry waiting for REFINE", e)
			}
		}
		climbed = admitted[0]
		return true
	})
	for _, id := range all {
		if st, err := m.tasks.Get(context.Background(), id); err != nil || st.Status != events.StatusPending {
			t.Fatalf("task %s: status %q (%v), want it unchanged", id, st.Status, err)
		}
	}
	// It failed: the rung is still thin, and the next retry climbs as its
	// canary while the last sleeps on.
	outcome := func(id string, success bool) {
		t.Helper()
		msg, err := trust.OutcomeMsg("burst", trust.Outcome{Key: id + ":2:outcome", Task: id, Rung: events.RungRefine, Retry: true, Success: success, At: time.Now().UTC()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	outcome(climbed, false)
	var second string
	eventually(t, "a second retry admitted as the rung's canary, the last asleep", func() bool {
		admitted := m.stageOf(events.StageAdmitted, all)
		if len(admitted) != 2 || len(m.asleep()) != 1 {
			return false
		}
		second = admitted[slices.IndexFunc(admitted, func(id string) bool { return id != climbed })]
		return true
	})
	// It succeeded: the rung pays, and the last goes.
	outcome(second, true)
	eventually(t, "the waiting retries admitted", func() bool {
		return len(m.stageOf(events.StageAdmitted, all)) == len(all) && len(m.asleep()) == 0
	})
}

// A retry holding its rung's place whose pass ends without an outcome
// that counts for trust (a refused request, a deployment fault) and whose
// task moves on to its next pass gives the place up to the next retry
// refused one: it waits for no outcome that will never come, nor for the
// place to expire (the canary TTL, 10 minutes).
func TestARungPlaceOfARetryThatMovedOnIsFreed(t *testing.T) {
	m, all := retriesOntoAnUnmeasuredRung(t, 2)
	var climbed string
	eventually(t, "one retry admitted, the other asleep waiting for its rung", func() bool {
		admitted := m.stageOf(events.StageAdmitted, all)
		if len(admitted) != 1 || len(m.asleep()) != 1 {
			return false
		}
		climbed = admitted[0]
		return true
	})
	// Its pass 2 recorded no outcome: the task went on to pass 3.
	if _, err := m.tasks.Update(context.Background(), climbed, func(st *events.TaskState, _ bool) error {
		st.Pass, st.Status = 3, events.StatusPending
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the waiting retry admitted in the place its holder left", func() bool {
		return len(m.stageOf(events.StageAdmitted, all)) == len(all) && len(m.asleep()) == 0
	})
	eventually(t, "the moved-on retry holds no place", func() bool {
		return !slices.ContainsFunc(m.view.Stats("burst").Rungs, func(c trust.Canary) bool { return c.Key == climbed })
	})
}

// retriesOntoAnUnmeasuredRung runs the gate for type "burst", scored and
// trusted (no canaries) with no retry measured on REFINE, and submits n
// retries (pass 2) climbing onto REFINE.
func retriesOntoAnUnmeasuredRung(t *testing.T, n int) (*meshGate, []string) {
	t.Helper()
	m := startGate(t, trust.Policy{PriorWeight: -1}, 100)
	m.outcomes("burst", 10, true, "before")
	eventually(t, "the view scores the type", func() bool { return len(m.view.Stats("burst").Outcomes) == 10 })
	all := ids("retry", n)
	for _, id := range all {
		m.submitRun(id, "burst", events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine})
	}
	return m, all
}

// submitRun publishes a verified pass run of task id of typ, its state
// created, as the verifier would.
func (m *meshGate) submitRun(id, typ string, run events.Run) {
	m.t.Helper()
	b := events.Base{Task: events.Task{ID: id, Type: typ, Subject: id + ".go"}, Run: run}
	if _, _, err := m.tasks.Create(context.Background(), task.New(b.Task)); err != nil {
		m.t.Fatal(err)
	}
	out, err := services.Next(b, events.StageVerified, events.EventVerified, events.Verified{Base: b})
	if err != nil {
		m.t.Fatal(err)
	}
	if _, err := m.js.PublishMsg(context.Background(), services.NatsMsg(out), jetstream.WithMsgID(out.MsgID)); err != nil {
		m.t.Fatal(err)
	}
}
