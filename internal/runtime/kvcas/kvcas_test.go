package kvcas_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// TestUpdateFrom: a value known at its revision is written without a read;
// a known value that a later write made stale, or that mutate finds nothing
// to change in, is read again — the result is always what the stored value
// and mutate make.
func TestUpdateFrom(t *testing.T) {
	put := func(t *testing.T, kv jetstream.KeyValue, keys ...string) uint64 {
		t.Helper()
		data, _ := json.Marshal(tally{Keys: keys})
		rev, err := kv.Put(t.Context(), "k", data)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	for _, tc := range []struct {
		name string
		// stored are the values written in turn; the known value is the
		// one written at index knownAt.
		stored  [][]string
		knownAt int
		mutate  func(*tally, bool) error
		want    []string
		gets    int
	}{
		{"known is current: no read", [][]string{{"a"}}, 0, add("b"), []string{"a", "b"}, 0},
		{"known is stale: read, then apply", [][]string{{"a"}, {"a", "x"}}, 0, add("b"), []string{"a", "x", "b"}, 1},
		{"nothing to change in the known value: read to be sure", [][]string{{"a"}, {"x"}}, 0, add("a"), []string{"x", "a"}, 1},
		{"nothing to change in the stored value either", [][]string{{"a"}}, 0, add("a"), []string{"a"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := bucket(t)
			kv := &natstest.CountReads{KeyValue: base}
			var known tally
			var knownRev uint64
			for i, keys := range tc.stored {
				rev := put(t, base, keys...)
				if i == tc.knownAt {
					known, knownRev = tally{Keys: slices.Clone(keys)}, rev
				}
			}
			v, rev, err := kvcas.UpdateFrom(t.Context(), kv, "k", &known, knownRev, tc.mutate)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(v.Keys, tc.want) {
				t.Errorf("value = %v, want %v", v.Keys, tc.want)
			}
			if kv.Reads() != tc.gets {
				t.Errorf("%d reads, want %d", kv.Reads(), tc.gets)
			}
			e, err := base.Get(t.Context(), "k")
			if err != nil {
				t.Fatal(err)
			}
			var stored tally
			if err := json.Unmarshal(e.Value(), &stored); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(stored.Keys, tc.want) || e.Revision() != rev {
				t.Errorf("stored %v at revision %d; UpdateFrom returned revision %d", stored.Keys, e.Revision(), rev)
			}
		})
	}

	t.Run("nothing known: reads like Update, creates a missing key", func(t *testing.T) {
		kv := &natstest.CountReads{KeyValue: bucket(t)}
		v, rev, err := kvcas.UpdateFrom(t.Context(), kv, "k", nil, 0, add("a"))
		if err != nil || rev == 0 || !slices.Equal(v.Keys, []string{"a"}) || kv.Reads() != 1 {
			t.Fatalf("UpdateFrom = %v, %d, %v with %d reads; want [a], a revision, one read", v.Keys, rev, err, kv.Reads())
		}
	})
}
