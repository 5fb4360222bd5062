package trust_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// newOutcomeStream creates the outcome stream as the mesh provisions it.
func newOutcomeStream(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: trust.OutcomeStream, Subjects: []string{trust.OutcomeFilter},
		MaxMsgsPerSubject: trust.Keep, Duplicates: time.Hour, AllowDirect: true,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
}

func publish(t *testing.T, js jetstream.JetStream, taskType string, o trust.Outcome) {
	t.Helper()
	m, err := trust.OutcomeMsg(taskType, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
}

func newView(t *testing.T, js jetstream.JetStream, facts jetstream.KeyValue) *trust.View {
	t.Helper()
	v, err := trust.NewView(t.Context(), js, facts, nil)
	if err != nil {
		t.Fatalf("view: %v", err)
	}
	t.Cleanup(v.Stop)
	return v
}

// eventually polls cond until it holds; a view follows the stream
// asynchronously, so what was published is there a moment later.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func keysOf(outcomes []trust.Outcome) []string {
	var k []string
	for _, o := range outcomes {
		k = append(k, o.Key)
	}
	return k
}

// What the stream holds when a view starts is in it when NewView returns,
// in (At, Key) order whatever order it was published in; an outcome
// published twice — within the dedup window (one message) or after it
// (two messages) — counts once.
func TestViewReadsTheStream(t *testing.T) {
	srv := natstest.Start(t)
	newOutcomeStream(t, srv.JS)
	all := seq("SFSSF")
	for _, i := range []int{3, 0, 4, 1, 2} {
		publish(t, srv.JS, "css_fix", all[i])
	}
	publish(t, srv.JS, "css_fix", all[2]) // deduplicated by the stream
	late := all[1]
	m, _ := trust.OutcomeMsg("css_fix", late)
	m.Header.Set("Nats-Msg-Id", "past-the-dedup-window")
	if _, err := srv.JS.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	publish(t, srv.JS, "other_fix", trust.Outcome{Key: "o1:1", Success: true, At: all[0].At})

	v := newView(t, srv.JS, nil)
	st := v.Stats("css_fix")
	if !slices.Equal(keysOf(st.Outcomes), keysOf(all)) {
		t.Errorf("window = %v, want %v", keysOf(st.Outcomes), keysOf(all))
	}
	if ok, failed := st.Counts(); ok != 3 || failed != 2 {
		t.Errorf("counts = %d/%d, want 3/2", ok, failed)
	}
	if got := v.All(); len(got) != 2 || got[0].Type != "css_fix" || got[1].Type != "other_fix" {
		t.Errorf("All = %+v", got)
	}
	if st := v.Stats("new_fix"); st.Type != "new_fix" || len(st.Outcomes) != 0 {
		t.Errorf("a type without outcomes: %+v", st)
	}
}

// An empty stream: NewView returns at once; outcomes published later
// reach the view.
func TestViewFollows(t *testing.T) {
	srv := natstest.Start(t)
	newOutcomeStream(t, srv.JS)
	v := newView(t, srv.JS, nil)
	for _, o := range seq("SSF") {
		publish(t, srv.JS, "css_fix", o)
	}
	eventually(t, "three outcomes in the view", func() bool { return len(v.Stats("css_fix").Outcomes) == 3 })
}

// Applied is closed by the next outcome the view applies, and only then:
// the gate's sweeper waits on it while passes wait for canaries.
func TestViewApplied(t *testing.T) {
	srv := natstest.Start(t)
	newOutcomeStream(t, srv.JS)
	v := newView(t, srv.JS, nil)
	applied := v.Applied()
	select {
	case <-applied:
		t.Fatal("closed with no outcome applied")
	default:
	}
	publish(t, srv.JS, "css_fix", seq("S")[0])
	select {
	case <-applied:
	case <-time.After(time.Minute):
		t.Fatal("not closed by an outcome")
	}
	if len(v.Stats("css_fix").Outcomes) != 1 {
		t.Fatal("closed before the outcome was in the view")
	}
	select {
	case <-v.Applied():
		t.Fatal("the next channel is closed already")
	default:
	}
}

// Sync returns once the view holds every outcome the stream held when it
// was called, with no polling by the caller; a view that stopped following
// the stream makes it fail (in SyncWait), not wait for ever.
func TestViewSync(t *testing.T) {
	srv := natstest.Start(t)
	newOutcomeStream(t, srv.JS)
	v := newView(t, srv.JS, nil)
	if err := v.Sync(t.Context(), "css_fix"); err != nil {
		t.Fatalf("sync of a type with no outcome: %v", err)
	}
	for _, o := range seq("SSF") {
		publish(t, srv.JS, "css_fix", o)
	}
	if err := v.Sync(t.Context(), "css_fix"); err != nil {
		t.Fatal(err)
	}
	if n := len(v.Stats("css_fix").Outcomes); n != 3 {
		t.Fatalf("after Sync the view holds %d outcomes, want 3", n)
	}
	v.Stop() // returns once the view applies nothing more: "late" never reaches it
	v.SyncWait = 50 * time.Millisecond
	publish(t, srv.JS, "css_fix", trust.Outcome{Key: "late", Success: true, At: time.Now()})
	if err := v.Sync(t.Context(), "css_fix"); err == nil {
		t.Fatal("Sync of a view that stopped following returned no error")
	}
}

// Eight recorders publishing at once lose nothing: there is no shared
// value to compare-and-set, and every view sees every outcome once.
func TestViewConcurrentRecorders(t *testing.T) {
	const writers, perWriter = 8, 25 // 200 = trust.Keep: every outcome stays
	srv := natstest.Start(t)
	newOutcomeStream(t, srv.JS)
	v := newView(t, srv.JS, nil)
	var wg sync.WaitGroup
	for w := range writers {
		_, js := srv.Connect(t) // each its own connection, like separate recorder instances
		wg.Go(func() {
			for i := range perWriter {
				o := trust.Outcome{Key: fmt.Sprintf("w%d-t%d:1", w, i), Success: i%4 != 0, At: time.Unix(int64(i), int64(w))}
				m, err := trust.OutcomeMsg("css_fix", o)
				if err == nil {
					_, err = js.PublishMsg(context.Background(), m)
				}
				if err != nil {
					t.Errorf("writer %d outcome %d: %v", w, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	eventually(t, "every outcome in the view", func() bool { return len(v.Stats("css_fix").Outcomes) == writers*perWriter })
	st := v.Stats("css_fix")
	if _, failed := st.Counts(); failed != writers*((perWriter+3)/4) {
		t.Errorf("failures = %d, want %d", failed, writers*((perWriter+3)/4))
	}
	if !slices.IsSortedFunc(st.Outcomes, func(a, b trust.Outcome) int { return a.At.Compare(b.At) }) {
		t.Error("window not in time order")
	}
}

// The stream keeps the newest Keep outcomes of a type, and so does a view.
func TestViewKeepsKeep(t *testing.T) {
	srv := natstest.Start(t)
	newOutcomeStream(t, srv.JS)
	base := time.Date(2026, 5, 18, 0, 0, 0, 0, time.UTC)
	for i := range trust.Keep + 10 {
		publish(t, srv.JS, "css_fix", trust.Outcome{Key: fmt.Sprintf("t%03d:1", i), Success: true, At: base.Add(time.Duration(i) * time.Second)})
	}
	v := newView(t, srv.JS, nil)
	got := v.Stats("css_fix").Outcomes
	if len(got) != trust.Keep || got[0].Key != "t010:1" || got[len(got)-1].Key != fmt.Sprintf("t%03d:1", trust.Keep+9) {
		t.Errorf("kept %d outcomes, %s … %s", len(got), got[0].Key, got[len(got)-1].Key)
	}
}

// The gate's facts come from the bucket, followed as the gate writes them.
func TestViewFacts(t *testing.T) {
	srv := natstest.Start(t)
	newOutcomeStream(t, srv.JS)
	kv := newKV(t, srv.JS)
	store := trust.NewStore(kv, trust.Policy{})
	ctx := t.Context()
	if _, _, err := store.Gate(ctx, "css_fix", "a:1:gate", true); err != nil {
		t.Fatal(err)
	}
	v := newView(t, srv.JS, kv)
	if st := v.Stats("css_fix"); st.BlockStreak != 1 || len(st.Gates) != 1 {
		t.Fatalf("facts at start = %+v", st)
	}
	if _, _, err := store.Gate(ctx, "css_fix", "b:1:gate", true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second block in the view", func() bool { return v.Stats("css_fix").BlockStreak == 2 })
	if ok, err := store.Canary(ctx, "new_fix", "c", time.Now(), trust.Policy{}, trust.Stats{}); err != nil || !ok {
		t.Fatalf("canary: %v %v", ok, err)
	}
	eventually(t, "the canary place in the view", func() bool { return len(v.Stats("new_fix").Canaries) == 1 })
}

// Insert keeps (At, Key) order, a limit, and refuses a key it holds and an
// outcome older than a full window.
func TestInsert(t *testing.T) {
	all := seq("SFSFS")
	var w []trust.Outcome
	for _, i := range []int{4, 2, 0, 3, 1} {
		var changed bool
		if w, changed = trust.Insert(w, all[i], 3); !changed && i >= 2 {
			t.Errorf("outcome %d not inserted", i)
		}
	}
	if !slices.Equal(keysOf(w), keysOf(all[2:])) {
		t.Errorf("window = %v, want %v", keysOf(w), keysOf(all[2:]))
	}
	if _, changed := trust.Insert(w, all[3], 3); changed {
		t.Error("a key already in the window was inserted again")
	}
	if _, changed := trust.Insert(w, all[0], 3); changed {
		t.Error("an outcome older than a full window was inserted")
	}
}
