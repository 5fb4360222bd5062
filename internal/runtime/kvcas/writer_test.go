package kvcas_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

type tally struct {
	Keys []string `json:"keys"`
}

// add is an idempotent update: it adds k unless it is there.
func add(k string) func(*tally, bool) error {
	return func(v *tally, _ bool) error {
		if slices.Contains(v.Keys, k) {
			return kvcas.ErrNoChange
		}
		v.Keys = append(slices.Clone(v.Keys), k)
		return nil
	}
}

func (v tally) clone() tally { v.Keys = slices.Clone(v.Keys); return v }

// writers are the two ways a Writer remembers what it wrote: the JSON it
// decodes for the next batch, or (Clone set) a copy of the value.
var writers = []struct {
	name string
	new  func(jetstream.KeyValue) *kvcas.Writer[tally]
}{
	{"json", kvcas.NewWriter[tally]},
	{"clone", func(kv jetstream.KeyValue) *kvcas.Writer[tally] {
		w := kvcas.NewWriter[tally](kv)
		w.Clone = tally.clone
		return w
	}},
}

// eachWriter runs test once per way of remembering.
func eachWriter(t *testing.T, test func(t *testing.T, newWriter func(jetstream.KeyValue) *kvcas.Writer[tally])) {
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) { test(t, w.new) })
	}
}

func bucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	srv := natstest.Start(t)
	kv, err := srv.JS.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "writer"})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// Two writers (two instances) and many goroutines each, every update twice
// (a redelivery): every key lands exactly once.
func TestWriterConcurrentExact(t *testing.T) { eachWriter(t, testWriterConcurrentExact) }

func testWriterConcurrentExact(t *testing.T, newWriter func(jetstream.KeyValue) *kvcas.Writer[tally]) {
	kv := bucket(t)
	writers := []*kvcas.Writer[tally]{newWriter(kv), newWriter(kv)}
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	for i := range n {
		for rep := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := writers[(i+rep)%2]
				if _, err := w.Update(context.Background(), "hot", add(fmt.Sprint(i))); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	v, _, _, err := kvcas.Get[tally](t.Context(), kv, "hot")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Keys) != n {
		t.Fatalf("%d keys stored, want %d", len(v.Keys), n)
	}
	slices.Sort(v.Keys)
	if len(slices.Compact(v.Keys)) != n {
		t.Fatalf("duplicates stored: %v", v.Keys)
	}
}

// A writer decides on the stored value, never on one it remembers from
// before another writer's update: an update that would change nothing on
// the remembered value is checked against a fresh read, and one that would
// change it is reapplied after the conflict.
func TestWriterNeverDecidesOnAStaleValue(t *testing.T) {
	eachWriter(t, testWriterNeverDecidesOnAStaleValue)
}

func testWriterNeverDecidesOnAStaleValue(t *testing.T, newWriter func(jetstream.KeyValue) *kvcas.Writer[tally]) {
	kv := bucket(t)
	a, b := newWriter(kv), newWriter(kv)
	ctx := t.Context()
	if _, err := a.Update(ctx, "k", add("x")); err != nil { // a remembers [x]
		t.Fatal(err)
	}
	if _, err := b.Update(ctx, "k", add("y")); err != nil { // stored: [x y]
		t.Fatal(err)
	}

	var seen []string
	v, err := a.Update(ctx, "k", func(v *tally, _ bool) error {
		seen = slices.Clone(v.Keys)
		return kvcas.ErrNoChange
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, []string{"x", "y"}) || !slices.Equal(v.Keys, []string{"x", "y"}) {
		t.Fatalf("a no-change update saw %v and returned %v, want the stored [x y]", seen, v.Keys)
	}

	if _, err := b.Update(ctx, "k", add("z")); err != nil { // stored: [x y z]; a still remembers [x]
		t.Fatal(err)
	}
	if v, err = a.Update(ctx, "k", add("w")); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(v.Keys, []string{"x", "y", "z", "w"}) {
		t.Fatalf("got %v, want [x y z w]: an update lost or applied to a stale value", v.Keys)
	}
	stored, _, _, err := kvcas.Get[tally](ctx, kv, "k")
	if err != nil || !slices.Equal(stored.Keys, v.Keys) {
		t.Fatalf("stored %v (%v), returned %v", stored.Keys, err, v.Keys)
	}
}

// An update that fails leaves the others of its batch applied, and its
// caller gets the error.
func TestWriterErrorIsTheCallersOwn(t *testing.T) { eachWriter(t, testWriterErrorIsTheCallersOwn) }

func testWriterErrorIsTheCallersOwn(t *testing.T, newWriter func(jetstream.KeyValue) *kvcas.Writer[tally]) {
	kv := bucket(t)
	w := newWriter(kv)
	ctx := t.Context()
	refused := fmt.Errorf("refused")
	var wg sync.WaitGroup
	results := make([]error, 20)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				_, results[i] = w.Update(ctx, "k", func(*tally, bool) error { return refused })
				return
			}
			_, results[i] = w.Update(ctx, "k", add(fmt.Sprint(i)))
		}()
	}
	wg.Wait()
	for i, err := range results {
		if want := i%2 == 0; (err == refused) != want {
			t.Fatalf("update %d: err %v", i, err)
		}
	}
	v, _, _, err := kvcas.Get[tally](ctx, kv, "k")
	if err != nil || len(v.Keys) != 10 {
		t.Fatalf("stored %v (%v), want the 10 accepted updates", v.Keys, err)
	}
}

// With Clone, a value a caller got back is its own: the next batches start
// from a copy of the remembered value, so an update that appends in place
// changes neither what earlier callers hold nor what the Writer remembers.
func TestWriterCloneSharesNothing(t *testing.T) {
	kv := bucket(t)
	w := kvcas.NewWriter[tally](kv)
	w.Clone = tally.clone
	ctx := t.Context()
	appendInPlace := func(k string) func(*tally, bool) error {
		return func(v *tally, _ bool) error { v.Keys = append(v.Keys, k); return nil }
	}
	var got []tally
	for _, k := range []string{"a", "b", "c", "d"} {
		v, err := w.Update(ctx, "k", appendInPlace(k))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	got[3].Keys[0] = "changed by a caller" // the latest value: must not reach the Writer
	v, err := w.Update(ctx, "k", appendInPlace("e"))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range [][]string{{"a"}, {"a", "b"}, {"a", "b", "c"}, {"changed by a caller", "b", "c", "d"}} {
		if !slices.Equal(got[i].Keys, want) {
			t.Fatalf("caller %d holds %v, want %v: a later update changed it", i, got[i].Keys, want)
		}
	}
	stored, _, _, err := kvcas.Get[tally](ctx, kv, "k")
	if err != nil || !slices.Equal(stored.Keys, []string{"a", "b", "c", "d", "e"}) || !slices.Equal(v.Keys, stored.Keys) {
		t.Fatalf("stored %v (%v), returned %v, want [a b c d e]", stored.Keys, err, v.Keys)
	}
}

// With Clone, a batch that changes its value in place and then changes its
// mind (ErrNoChange) or fails leaves the remembered value as written.
func TestWriterCloneKeepsTheRememberedValue(t *testing.T) {
	kv := bucket(t)
	w := kvcas.NewWriter[tally](kv)
	w.Clone = tally.clone
	ctx := t.Context()
	if _, err := w.Update(ctx, "k", add("a")); err != nil {
		t.Fatal(err)
	}
	scribble := func(v *tally, _ bool) error { v.Keys[0] = "scribbled"; return kvcas.ErrNoChange }
	if _, err := w.Update(ctx, "k", scribble); err != nil {
		t.Fatal(err)
	}
	v, err := w.Update(ctx, "k", add("b"))
	if err != nil {
		t.Fatal(err)
	}
	stored, _, _, err := kvcas.Get[tally](ctx, kv, "k")
	if err != nil || !slices.Equal(stored.Keys, []string{"a", "b"}) || !slices.Equal(v.Keys, stored.Keys) {
		t.Fatalf("stored %v (%v), returned %v, want [a b]", stored.Keys, err, v.Keys)
	}
}
