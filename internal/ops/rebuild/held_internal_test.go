package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// heldStream builds stream messages for one task of css_fix, numbered from
// sequence 1 in the order given.
type heldStream struct {
	t0   time.Time
	msgs []stored
}

func (s *heldStream) base(id string, pass, attempt int, after time.Duration) events.Base {
	return events.Base{Task: events.Task{ID: id, Type: "css_fix", Subject: "a.css", SubmittedAt: s.t0},
		Run: events.Run{Pass: pass, Attempt: attempt}, At: s.t0.Add(after)}
}

func (s *heldStream) add(subject string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	seq := uint64(len(s.msgs) + 1)
	s.msgs = append(s.msgs, stored{subject: subject, data: data, seq: seq, at: s.t0.Add(time.Duration(seq) * time.Millisecond)})
}

func (s *heldStream) queued(id string) {
	s.add(events.TaskSubject(id, events.StageQueued), events.Queued{Base: s.base(id, 1, 1, 0)})
}

// held publishes a held event of pass (attempt = pass) at t0+after.
func (s *heldStream) held(id string, pass int, hold events.Hold, after time.Duration, reason string) events.Held {
	ev := events.Held{Base: s.base(id, pass, pass, after), Hold: hold, Reason: reason,
		Trust: events.TrustDecision{Cause: events.CauseTrust, Reason: reason}}
	s.add(events.TaskSubject(id, events.StageHeld), ev)
	return ev
}

// wake republishes a held event as the gate's sweeper does.
func (s *heldStream) wake(ev events.Held) {
	s.add(events.TaskSubject(ev.Task.ID, events.StageWake), ev)
}

func (s *heldStream) admitted(id string, pass int, after time.Duration) {
	s.add(events.TaskSubject(id, events.StageAdmitted), events.Admitted{Base: s.base(id, pass, pass, after),
		Trust: events.TrustDecision{Cause: events.CauseProbe, Probe: true}})
}

func (s *heldStream) gated(id string, pass int, after time.Duration) {
	s.add(events.ReviewSubject(events.ReviewGated, id), events.Gated{Base: s.base(id, pass, pass, after),
		Trust: events.TrustDecision{Cause: events.CauseTrust, Blocked: true}, Reason: "held 24h without recovering"})
}

func replayOf(msgs []stored) *Stores {
	r := newReplayer(Options{Policy: policy.Static(&policy.File{})})
	r.replay(msgs)
	return r.out
}

// The held index a replay rebuilds: an entry for a pass held for its
// type's trust, from its first held event (its time, its sequence, its
// reason); one for a pass waiting for canaries (or a retry for its rung),
// from its held event waiting for them; none once the gate admitted the pass or stopped it; a
// wake changes no store.
func TestReplayedHeldIndex(t *testing.T) {
	const wait = "waiting for the canaries of css_fix"
	const rungWait = "waiting for the REFINE retries of css_fix being measured"
	t0 := time.Date(2026, 5, 18, 12, 0, 0, 123456789, time.UTC)
	entry := func(id string, pass int, after time.Duration, seq uint64, reason string) services.HeldEntry {
		return services.HeldEntry{Task: id, Type: "css_fix", Pass: pass, Retry: pass > 1, Since: t0.Add(after), Seq: seq, Reason: reason}
	}
	canary := func(id string, after time.Duration, seq uint64) services.HeldEntry {
		e := entry(id, 1, after, seq, wait)
		e.Hold = events.HoldCanary
		return e
	}
	const low = "css_fix scores 0.20, below its threshold 0.70"
	cases := []struct {
		name   string
		stream func(s *heldStream)
		want   []services.HeldEntry
	}{
		{"held", func(s *heldStream) {
			s.queued("t1")
			s.held("t1", 1, events.HoldTrust, time.Second, low)
		}, []services.HeldEntry{entry("t1", 1, time.Second, 2, low)}},
		{"held, woken twice, still held", func(s *heldStream) {
			s.queued("t1")
			ev := s.held("t1", 1, events.HoldTrust, time.Second, low)
			s.wake(ev)
			s.wake(ev)
		}, []services.HeldEntry{entry("t1", 1, time.Second, 2, low)}},
		{"held, then admitted", func(s *heldStream) {
			s.queued("t1")
			s.held("t1", 1, events.HoldTrust, time.Second, low)
			s.admitted("t1", 1, time.Minute)
		}, nil},
		{"held, admitted, then a late wake", func(s *heldStream) {
			s.queued("t1")
			ev := s.held("t1", 1, events.HoldTrust, time.Second, low)
			s.admitted("t1", 1, time.Minute)
			s.wake(ev)
		}, nil},
		{"held past its hold time: to a human", func(s *heldStream) {
			s.queued("t1")
			s.held("t1", 1, events.HoldTrust, time.Second, low)
			s.gated("t1", 1, 24*time.Hour)
		}, nil},
		{"waiting for canaries", func(s *heldStream) {
			s.queued("t1")
			s.held("t1", 1, events.HoldCanary, time.Second, wait)
		}, []services.HeldEntry{canary("t1", time.Second, 2)}},
		{"waiting its turn", func(s *heldStream) {
			s.queued("t1")
			s.held("t1", 1, events.HoldQueued, time.Second, "waiting its turn")
		}, []services.HeldEntry{func() services.HeldEntry {
			e := entry("t1", 1, time.Second, 2, "waiting its turn")
			e.Hold = events.HoldQueued
			return e
		}()}},
		{"waiting for canaries, woken, then admitted", func(s *heldStream) {
			s.queued("t1")
			ev := s.held("t1", 1, events.HoldCanary, time.Second, wait)
			s.wake(ev)
			s.admitted("t1", 1, time.Minute)
		}, nil},
		{"waiting for canaries, then past its hold as a human decided", func(s *heldStream) {
			s.queued("t1")
			s.held("t1", 1, events.HoldCanary, time.Second, wait)
			s.gated("t1", 1, time.Hour)
		}, nil},
		{"waited for canaries, then held for trust", func(s *heldStream) {
			s.queued("t1")
			s.held("t1", 1, events.HoldCanary, time.Second, wait)
			s.held("t1", 1, events.HoldTrust, 2*time.Second, low)
		}, []services.HeldEntry{entry("t1", 1, 2*time.Second, 3, low)}},
		{"held twice (past the deduplication window): the first", func(s *heldStream) {
			s.queued("t1")
			s.held("t1", 1, events.HoldTrust, time.Second, low)
			s.held("t1", 1, events.HoldTrust, time.Hour, "another look")
		}, []services.HeldEntry{entry("t1", 1, time.Second, 2, low)}},
		{"a retry waiting for its rung: the rung it waits to climb onto", func(s *heldStream) {
			s.queued("t1")
			ev := events.Held{Base: s.base("t1", 1, 2, time.Second), Hold: events.HoldRung, Reason: rungWait}
			ev.Run.Rung = events.RungRefine // pass 1: the stream has no retry event to move the state on
			s.add(events.TaskSubject("t1", events.StageHeld), ev)
		}, []services.HeldEntry{func() services.HeldEntry {
			e := entry("t1", 1, time.Second, 2, rungWait)
			e.Retry, e.Hold, e.Rung = true, events.HoldRung, events.RungRefine
			return e
		}()}},
		{"a retry held", func(s *heldStream) {
			s.queued("t1")
			s.held("t1", 2, events.HoldTrust, time.Second, low)
		}, []services.HeldEntry{entry("t1", 2, time.Second, 2, low)}},
		{"two tasks, one admitted", func(s *heldStream) {
			s.queued("t1")
			s.queued("t2")
			s.held("t1", 1, events.HoldTrust, time.Second, low)
			s.held("t2", 1, events.HoldTrust, 2*time.Second, low)
			s.admitted("t1", 1, time.Minute)
		}, []services.HeldEntry{entry("t2", 1, 2*time.Second, 4, low)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &heldStream{t0: t0}
			c.stream(s)
			got := replayOf(s.msgs)
			want := map[string]*services.HeldEntry{}
			for _, e := range c.want {
				want[e.Key()] = &e
			}
			if !reflect.DeepEqual(got.Held, want) {
				t.Fatalf("held index:\n%v\nwant\n%v", entries(got.Held), entries(want))
			}
			if len(got.Skipped) > 0 {
				t.Fatalf("skipped: %v", got.Skipped)
			}
			// A wake is a look, no decision: without the wakes every store
			// is the same.
			without := replayOf(slices.DeleteFunc(slices.Clone(s.msgs), func(m stored) bool {
				_, stage, _ := events.ParseTaskSubject(m.subject)
				return stage == events.StageWake
			}))
			without.replayed = got.replayed
			if !reflect.DeepEqual(got, without) {
				t.Fatalf("the wakes changed the stores:\n%+v\nwithout them\n%+v", got, without)
			}
		})
	}
}

func entries(m map[string]*services.HeldEntry) []services.HeldEntry {
	var out []services.HeldEntry
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, *m[k])
	}
	return out
}

// The held index is compared entry by entry, every field: a missing entry,
// an extra one and one whose sequence differs are reported; Apply writes
// the missing, rewrites the differing and deletes the extra, leaves an
// entry naming a message past the replay, and applied again writes
// nothing.
func TestApplyRestoresTheHeldIndex(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	kv, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.BucketHeld, LimitMarkerTTL: services.HeldMarkerTTL})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	e := func(id string, seq uint64) services.HeldEntry {
		return services.HeldEntry{Task: id, Type: "css_fix", Pass: 1, Since: t0.Add(time.Duration(seq) * time.Second), Seq: seq, Reason: "low"}
	}
	same, lost, moved, extra, newer := e("same", 3), e("lost", 4), e("moved", 5), e("extra", 6), e("newer", 20)
	put := func(v services.HeldEntry) {
		t.Helper()
		if _, err := kv.Put(ctx, v.Key(), marshal(v)); err != nil {
			t.Fatal(err)
		}
	}
	tampered := moved
	tampered.Seq = 9
	for _, v := range []services.HeldEntry{same, tampered, extra, newer} {
		put(v)
	}
	built := func() *Stores {
		return &Stores{replayed: 10, Held: map[string]*services.HeldEntry{same.Key(): &same, lost.Key(): &lost, moved.Key(): &moved}}
	}
	live := Live{Held: kv}
	diffs, err := Compare(ctx, live, built())
	if err != nil {
		t.Fatal(err)
	}
	want := []Difference{
		{events.BucketHeld, lost.Key(), "(entry)", "missing", "present"},
		{events.BucketHeld, moved.Key(), "seq", "9", "5"},
		{events.BucketHeld, extra.Key(), "(entry)", "present", "missing"},
	}
	if !slices.Equal(diffs, want) {
		t.Fatalf("differences:\n%v\nwant\n%v", diffs, want)
	}
	if err := Apply(ctx, live, built()); err != nil {
		t.Fatal(err)
	}
	if diffs, err := Compare(ctx, live, built()); err != nil || len(diffs) != 0 {
		t.Fatalf("after Apply: %v %v", diffs, err)
	}
	if _, err := kv.Get(ctx, extra.Key()); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the entry no event implies: %v", err)
	}
	if _, err := kv.Get(ctx, newer.Key()); err != nil {
		t.Fatalf("the entry of a pass held after the replay: %v", err)
	}
	for _, v := range []services.HeldEntry{lost, moved} {
		got, err := kv.Get(ctx, v.Key())
		if err != nil {
			t.Fatal(err)
		}
		if dec, err := services.DecodeHeldEntry(v.Key(), got.Value()); err != nil || dec != v {
			t.Fatalf("%s after Apply: %+v %v", v.Key(), dec, err)
		}
	}
	status, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := status.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
	if err := Apply(ctx, live, built()); err != nil {
		t.Fatal(err)
	}
	status, err = kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after := status.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq; after != before {
		t.Fatalf("a second Apply wrote the held index: last sequence %d, then %d", before, after)
	}
}

// Past the horizon, the held entries of a task created before it, and an
// entry held since before it, are taken as the live index holds them.
func TestHeldIndexBeforeHorizon(t *testing.T) {
	h := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	before, after := h.Add(-time.Hour), h.Add(time.Hour)
	e := func(id string, since time.Time, seq uint64) services.HeldEntry {
		return services.HeldEntry{Task: id, Type: "css_fix", Pass: 1, Since: since, Seq: seq}
	}
	old, gone, partial, fresh := e("old", before, 1), e("gone", before, 2), e("partial", after, 7), e("fresh", after, 8)
	raw := func(v services.HeldEntry) *json.RawMessage { r := marshal(v); return &r }
	cur := &current{
		tasks: map[string]*events.TaskState{"old": {ID: "old", Status: events.StatusHeld, Pass: 1, CreatedAt: before}},
		held:  map[string]*json.RawMessage{old.Key(): raw(old), gone.Key(): raw(gone), fresh.Key(): raw(fresh)},
	}
	s := &Stores{Horizon: h, replayed: 10,
		Tasks: map[string]*events.TaskState{
			"partial": {ID: "partial", Status: events.StatusHeld, Pass: 1}, // its queued event gone
			"fresh":   {ID: "fresh", Status: events.StatusHeld, Pass: 1, CreatedAt: after},
		},
		Held: map[string]*services.HeldEntry{partial.Key(): &partial}}
	for range 2 {
		s.keepBeforeHorizon(cur)
		s.keepAfterReplay(cur)
	}
	if got := slices.Sorted(maps.Keys(s.Held)); !slices.Equal(got, slices.Sorted(slices.Values([]string{old.Key(), gone.Key()}))) {
		t.Fatalf("held entries %v: want the live ones of the task created before the horizon and the one held since before it", got)
	}
	if diffs := compareHeld(cur.held, s.Held); len(diffs) != 1 || diffs[0].Key != fresh.Key() {
		t.Fatalf("differences %v: want only the entry of a task created after the horizon the replay does not hold", diffs)
	}
}
