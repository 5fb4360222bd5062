package kvcas

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

type value struct {
	N int `json:"n"`
}

// rival is a bucket where another writer always gets there first: every
// compare-and-set of the key finds it changed.
type rival struct {
	jetstream.KeyValue
}

func (r rival) Update(ctx context.Context, key string, data []byte, rev uint64) (uint64, error) {
	if _, err := r.KeyValue.Put(ctx, key, []byte(`{"n":-1}`)); err != nil {
		return 0, err
	}
	return r.KeyValue.Update(ctx, key, data, rev)
}

// recordWaits replaces the wait between conflicts for the test: it
// records each delay and returns at once.
func recordWaits(t *testing.T) *[]time.Duration {
	t.Helper()
	var waits []time.Duration
	old := wait
	wait = func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		return ctx.Err()
	}
	t.Cleanup(func() { wait = old })
	return &waits
}

// A key another writer keeps changing: the compare-and-set is retried at
// once after the first conflict, then after delays that grow with full
// jitter up to a cap, and given up (ErrContended) after MaxConflicts —
// never a hot loop, never for ever — and every conflict is counted.
func TestContendedUpdateBacksOffAndGivesUp(t *testing.T) {
	srv := natstest.Start(t)
	kv, err := srv.JS.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "contended"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "k", []byte(`{"n":0}`)); err != nil {
		t.Fatal(err)
	}
	incr := func(v *value, _ bool) error { v.N++; return nil }
	for name, update := range map[string]func(ctx context.Context) error{
		"UpdateFrom": func(ctx context.Context) error {
			_, _, err := UpdateFrom(ctx, rival{kv}, "k", nil, 0, incr)
			return err
		},
		"Writer": func(ctx context.Context) error {
			_, err := NewWriter[value](rival{kv}).Update(ctx, "k", incr)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			waits := recordWaits(t)
			before := testutil.ToFloat64(conflicts.WithLabelValues("contended"))
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // a safety net, not a measure
			defer cancel()
			err := update(ctx)
			if !errors.Is(err, ErrContended) {
				t.Fatalf("err = %v, want ErrContended", err)
			}
			if len(*waits) != MaxConflicts-2 {
				t.Fatalf("%d waits, want %d: the first conflict retries at once, each later one but the last waits", len(*waits), MaxConflicts-2)
			}
			for i, d := range *waits {
				if ceiling := conflictCeiling(i + 2); d < 0 || d > ceiling || ceiling > maxConflictDelay {
					t.Errorf("wait %d is %s, want within [0, %s] (cap %s)", i, d, ceiling, maxConflictDelay)
				}
			}
			if n := testutil.ToFloat64(conflicts.WithLabelValues("contended")) - before; n != MaxConflicts {
				t.Errorf("%v conflicts counted, want %d", n, MaxConflicts)
			}
		})
	}
}

// The delay after the n-th consecutive conflict: none after the first, then
// a ceiling that doubles from baseConflictDelay up to maxConflictDelay,
// drawn with full jitter.
func TestConflictDelay(t *testing.T) {
	for _, tt := range []struct {
		n    int
		r    float64
		want time.Duration
	}{
		{1, 0.5, 0},
		{2, 1, baseConflictDelay},
		{3, 1, 2 * baseConflictDelay},
		{2, 0.5, baseConflictDelay / 2},
		{40, 1, maxConflictDelay},
		{1 << 20, 0.999, time.Duration(0.999 * float64(maxConflictDelay))},
	} {
		if got := conflictDelay(tt.n, tt.r); got != tt.want {
			t.Errorf("conflictDelay(%d, %g) = %s, want %s", tt.n, tt.r, got, tt.want)
		}
	}
}
