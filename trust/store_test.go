package trust_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/trust"
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

func TestStorePutAll(t *testing.T) {
	srv := natstest.Start(t)
	store := trust.NewStore(newKV(t, srv.JS), trust.Policy{})
	ctx := t.Context()
	all, err := store.All(ctx, srv.JS)
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
	all, err = store.All(ctx, srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Type != "a_fix" || all[1].Type != "b_fix" {
		t.Fatalf("All = %+v", all)
	}
	for i := range want {
		// The bucket keeps the gate's facts only: the outcomes are a stream.
		if got := all[i]; len(got.Outcomes) != 0 || got.BlockStreak != want[i].BlockStreak || len(got.Gates) != len(want[i].Gates) {
			t.Errorf("All[%d] = %+v, want %+v", i, got, want[i])
		}
	}
}

func TestStoreRejectsInvalidInput(t *testing.T) {
	srv := natstest.Start(t)
	store := trust.NewStore(newKV(t, srv.JS), trust.Policy{})
	ctx := t.Context()
	if _, _, err := store.Gate(ctx, "CSS.fix", "k", true); !errors.Is(err, trust.ErrInvalid) {
		t.Errorf("invalid type: err = %v", err)
	}
	if _, err := trust.OutcomeMsg("CSS.fix", trust.Outcome{Key: "k"}); !errors.Is(err, trust.ErrInvalid) {
		t.Errorf("outcome of an invalid type: err = %v", err)
	}
	if _, err := trust.OutcomeMsg("css_fix", trust.Outcome{}); !errors.Is(err, trust.ErrInvalid) {
		t.Errorf("outcome without a key: err = %v", err)
	}
	if _, _, err := store.Gate(ctx, "css_fix", "", true); !errors.Is(err, trust.ErrInvalid) {
		t.Errorf("gate without a key: err = %v", err)
	}
	if err := store.Put(ctx, trust.Stats{}); !errors.Is(err, trust.ErrInvalid) {
		t.Errorf("put without a type: err = %v", err)
	}
}
