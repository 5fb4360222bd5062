package trust_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/internal/natstest"
	"dispatchmesh/trust"
)

func newKV(t *testing.T, js jetstream.JetStream) jetstream.KeyValue {
	t.Helper()
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "test_trust"})
	if err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	return kv
}

func TestStoreGetAbsent(t *testing.T) {
	srv := natstest.Start(t)
	store := trust.NewStore(newKV(t, srv.JS), trust.Policy{})
	st, err := store.Get(t.Context(), "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	if st.Type != "css_fix" || len(st.Outcomes) != 0 || st.BlockStreak != 0 {
		t.Errorf("absent stats = %+v", st)
	}
}

func TestStoreRecordIdempotent(t *testing.T) {
	srv := natstest.Start(t)
	store := trust.NewStore(newKV(t, srv.JS), trust.Policy{})
	ctx := t.Context()
	o := trust.Outcome{Key: "task1:1", Success: false, At: time.Date(2026, 5, 18, 14, 22, 0, 0, time.UTC)}
	for range 2 {
		if _, err := store.Record(ctx, "css_fix", o, ""); err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	if ok, failed := st.Counts(); failed != 1 || ok != 0 || len(st.Outcomes) != 1 {
		t.Errorf("after a duplicate record: %+v", st)
	}
	if !st.Outcomes[0].At.Equal(o.At) || st.Outcomes[0].Key != o.Key {
		t.Errorf("stored outcome = %+v, want %+v", st.Outcomes[0], o)
	}
}

func TestStoreGateStreakAndProbe(t *testing.T) {
	srv := natstest.Start(t)
	store := trust.NewStore(newKV(t, srv.JS), trust.Policy{})
	ctx := t.Context()
	for i := 1; i <= 5; i++ {
		probe, streak, err := store.Gate(ctx, "css_fix", fmt.Sprintf("t%d:1", i), true)
		if err != nil {
			t.Fatal(err)
		}
		if probe || streak != i {
			t.Fatalf("block %d: probe=%v streak=%d", i, probe, streak)
		}
	}
	probe, streak, err := store.Gate(ctx, "css_fix", "t6:1", true)
	if err != nil {
		t.Fatal(err)
	}
	if !probe || streak != 0 {
		t.Fatalf("6th call: probe=%v streak=%d, want a probe and a reset streak", probe, streak)
	}
	// Redelivery of the probe's gate call: same answer, nothing changes.
	probe, streak, err = store.Gate(ctx, "css_fix", "t6:1", true)
	if err != nil {
		t.Fatal(err)
	}
	if !probe || streak != 0 {
		t.Errorf("redelivered probe: probe=%v streak=%d", probe, streak)
	}
	probe, streak, err = store.Gate(ctx, "css_fix", "t7:1", true)
	if err != nil {
		t.Fatal(err)
	}
	if probe || streak != 1 {
		t.Errorf("block after the probe: probe=%v streak=%d, want false 1", probe, streak)
	}
}

func TestStoreGateRedelivery(t *testing.T) {
	srv := natstest.Start(t)
	store := trust.NewStore(newKV(t, srv.JS), trust.Policy{})
	ctx := t.Context()
	for range 3 {
		probe, streak, err := store.Gate(ctx, "css_fix", "t1:1", true)
		if err != nil {
			t.Fatal(err)
		}
		if probe || streak != 1 {
			t.Fatalf("gate t1:1: probe=%v streak=%d, want false 1", probe, streak)
		}
	}
}

func TestStoreGateAdmitWritesNothing(t *testing.T) {
	srv := natstest.Start(t)
	kv := newKV(t, srv.JS)
	store := trust.NewStore(kv, trust.Policy{})
	ctx := t.Context()
	if _, _, err := store.Gate(ctx, "css_fix", "t1:1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "css_fix"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("admitting a clean type wrote the key (err=%v)", err)
	}

	if _, _, err := store.Gate(ctx, "css_fix", "t2:1", true); err != nil {
		t.Fatal(err)
	}
	if _, streak, err := store.Gate(ctx, "css_fix", "t3:1", false); err != nil || streak != 0 {
		t.Fatalf("admit after a block: streak=%d err=%v", streak, err)
	}
	e, err := kv.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Gate(ctx, "css_fix", "t4:1", false); err != nil {
		t.Fatal(err)
	}
	after, err := kv.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	if after.Revision() != e.Revision() {
		t.Errorf("admit with a zero streak wrote revision %d (was %d)", after.Revision(), e.Revision())
	}
}

func TestStoreConcurrentRecords(t *testing.T) {
	const writers, perWriter = 8, 50
	srv := natstest.Start(t)
	all := trust.Policy{Window: writers * perWriter} // every outcome stays in the window
	reader := trust.NewStore(newKV(t, srv.JS), all)
	ctx := t.Context()

	var wg sync.WaitGroup
	for w := range writers {
		// Each writer has its own connection, like separate recorder instances.
		_, js := srv.Connect(t)
		kv, err := js.KeyValue(ctx, "test_trust")
		if err != nil {
			t.Fatal(err)
		}
		store := trust.NewStore(kv, all)
		wg.Go(func() {
			for i := range perWriter {
				o := trust.Outcome{Key: fmt.Sprintf("w%d-t%d:1", w, i), Success: i%4 != 0}
				if _, err := store.Record(ctx, "css_fix", o, ""); err != nil {
					t.Errorf("writer %d record %d: %v", w, i, err)
					return
				}
			}
		})
	}
	wg.Wait()

	st, err := reader.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	ok, failed := st.Counts()
	if got := ok + failed; got != writers*perWriter {
		t.Errorf("window holds %d outcomes, want %d (lost updates)", got, writers*perWriter)
	}
	if want := writers * ((perWriter + 3) / 4); failed != want { // every i%4 == 0 failed
		t.Errorf("failures = %d, want %d", failed, want)
	}
	seen := map[string]bool{}
	for _, o := range st.Outcomes {
		if seen[o.Key] {
			t.Errorf("outcome %s twice in the window", o.Key)
		}
		seen[o.Key] = true
	}
}

func TestStorePutAll(t *testing.T) {
	srv := natstest.Start(t)
	store := trust.NewStore(newKV(t, srv.JS), trust.Policy{})
	ctx := t.Context()
	all, err := store.All(ctx)
	if err != nil || len(all) != 0 {
		t.Fatalf("All on an empty bucket = %v, %v", all, err)
	}
	want := []trust.Stats{
		{Type: "a_fix", Outcomes: seq("SF")},
		{Type: "b_fix", Outcomes: seq("S"), BlockStreak: 2, Gates: []trust.GateMark{{Key: "x:1"}}},
	}
	for _, st := range []trust.Stats{want[1], want[0]} {
		if err := store.Put(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Record(ctx, "a_fix", trust.Outcome{Key: "late:1", Success: true}, ""); err != nil {
		t.Fatal(err)
	}
	want[0].Outcomes = append(want[0].Outcomes, trust.Outcome{Key: "late:1", Success: true})
	all, err = store.All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Type != "a_fix" || all[1].Type != "b_fix" {
		t.Fatalf("All = %+v", all)
	}
	for i := range want {
		if got := all[i]; len(got.Outcomes) != len(want[i].Outcomes) || got.BlockStreak != want[i].BlockStreak || len(got.Gates) != len(want[i].Gates) {
			t.Errorf("All[%d] = %+v, want %+v", i, got, want[i])
		}
	}
}

func TestStoreRejectsInvalidInput(t *testing.T) {
	srv := natstest.Start(t)
	store := trust.NewStore(newKV(t, srv.JS), trust.Policy{})
	ctx := t.Context()
	if _, err := store.Record(ctx, "CSS.fix", trust.Outcome{Key: "k"}, ""); !errors.Is(err, trust.ErrInvalid) {
		t.Errorf("invalid type: err = %v", err)
	}
	if _, err := store.Record(ctx, "css_fix", trust.Outcome{}, ""); !errors.Is(err, trust.ErrInvalid) {
		t.Errorf("outcome without a key: err = %v", err)
	}
	if _, _, err := store.Gate(ctx, "css_fix", "", true); !errors.Is(err, trust.ErrInvalid) {
		t.Errorf("gate without a key: err = %v", err)
	}
	if err := store.Put(ctx, trust.Stats{}); !errors.Is(err, trust.ErrInvalid) {
		t.Errorf("put without a type: err = %v", err)
	}
}
