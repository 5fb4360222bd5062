package trust_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

func TestPolicyAdmitCanary(t *testing.T) {
	now := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	held := func(keys ...string) trust.Stats {
		var s trust.Stats
		for _, k := range keys {
			s.Canaries = append(s.Canaries, trust.Canary{Key: k, At: now.Add(-time.Minute)})
		}
		return s
	}
	tests := []struct {
		name          string
		p             trust.Policy
		s             trust.Stats
		key           string
		admit, change bool
		left          int // places held afterwards
	}{
		{"a free place", trust.Policy{Canary: 3}, held("a", "b"), "c", true, true, 3},
		{"every place held", trust.Policy{Canary: 3}, held("a", "b", "c"), "d", false, false, 3},
		{"a redelivery keeps its place", trust.Policy{Canary: 3}, held("a", "b", "c"), "b", true, false, 3},
		{"a scored type has no canaries", trust.Policy{MinOutcomes: 1}, trust.Stats{Outcomes: []trust.Outcome{{Key: "o", End: true}}}, "d", true, false, 0},
		{"a bigger canary", trust.Policy{Canary: 5}, held("a", "b", "c"), "d", true, true, 4},
		{"no canaries", trust.Policy{Canary: -1}, held("a", "b", "c"), "d", true, false, 3},
		{"expired places are given up", trust.Policy{Canary: 3, CanaryTTL: 30 * time.Second}, held("a", "b", "c"), "d", true, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(tt.s.Canaries)
			next, admit, changed := tt.p.AdmitCanary(tt.s, tt.key, now)
			if admit != tt.admit || changed != tt.change || len(next.Canaries) != tt.left {
				t.Fatalf("admit=%v changed=%v places=%d, want %v %v %d", admit, changed, len(next.Canaries), tt.admit, tt.change, tt.left)
			}
			if len(tt.s.Canaries) != before {
				t.Fatal("the input was modified")
			}
		})
	}
}

// A task's place is given up when it ends, and every place once the type
// is scored; a key that holds none changes nothing.
func TestCanaryReleased(t *testing.T) {
	now := time.Now()
	p := trust.Policy{MinOutcomes: 3}
	s, _, _ := p.AdmitCanary(trust.Stats{}, "t1", now)
	s, _, _ = p.AdmitCanary(s, "t2", now)
	if _, changed := trust.Release(s, "nope"); changed {
		t.Fatal("releasing a key without a place changed the stats")
	}
	s, changed := trust.Release(s, "t1")
	if !changed || len(s.Canaries) != 1 || s.Canaries[0].Key != "t2" {
		t.Fatalf("release: changed=%v %+v", changed, s.Canaries)
	}
	for i := range 3 {
		s, _ = p.Record(s, trust.Outcome{Key: fmt.Sprint(i), End: true, At: now})
	}
	if s.Canaries != nil {
		t.Fatalf("a scored type keeps canary places: %+v", s.Canaries)
	}
}

func TestPolicyRungBelow(t *testing.T) {
	retries := func(rung events.Rung, successes, failures int) []trust.Outcome {
		var out []trust.Outcome
		for i := range successes + failures {
			out = append(out, trust.Outcome{Key: fmt.Sprintf("%s%d", rung, i), Rung: rung, Retry: true, Success: i < successes})
		}
		return out
	}
	firsts := []trust.Outcome{{Key: "f1", Rung: "PIVOT"}, {Key: "f2", Rung: "PIVOT"}} // first attempts started on PIVOT: not retries
	tests := []struct {
		name      string
		p         trust.Policy
		outcomes  []trust.Outcome
		rung      events.Rung
		below     bool
		tries, ok int
	}{
		{"no data: the ladder applies", trust.Policy{}, nil, "PIVOT", false, 0, 0},
		{"too few samples", trust.Policy{}, retries("PIVOT", 0, 7), "PIVOT", false, 7, 0},
		{"enough samples, none succeeded", trust.Policy{}, retries("PIVOT", 0, 8), "PIVOT", true, 8, 0},
		{"at the floor", trust.Policy{}, retries("PIVOT", 2, 6), "PIVOT", false, 8, 2},
		{"just below the floor", trust.Policy{}, retries("PIVOT", 2, 7), "PIVOT", true, 9, 2},
		{"another rung's data", trust.Policy{}, retries("REFINE", 0, 9), "PIVOT", false, 0, 0},
		{"first attempts are not retries", trust.Policy{}, append(firsts, retries("PIVOT", 0, 7)...), "PIVOT", false, 7, 0},
		{"a floor of its own", trust.Policy{RungFloor: 0.5, RungMinSamples: 4}, retries("REFINE", 1, 3), "REFINE", true, 4, 1},
		{"floor off", trust.Policy{RungFloor: -1}, retries("PIVOT", 0, 20), "PIVOT", false, 20, 0},
		{"pipeline steps have no rung", trust.Policy{}, retries("", 0, 20), "", false, 20, 0},
		{"old samples leave the window", trust.Policy{Window: 10}, append(retries("PIVOT", 0, 8), retries("F", 5, 0)...), "PIVOT", false, 5, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			below, tries, ok := tt.p.RungBelow(trust.Stats{Outcomes: tt.outcomes}, tt.rung)
			if below != tt.below || tries != tt.tries || ok != tt.ok {
				t.Fatalf("below=%v %d/%d, want %v %d/%d", below, ok, tries, tt.below, tt.ok, tt.tries)
			}
		})
	}
}

// Many gate instances asking at once never admit more canaries than places.
func TestStoreCanaryConcurrent(t *testing.T) {
	srv := natstest.Start(t)
	store := trust.NewStore(newKV(t, srv.JS), trust.Policy{})
	ctx := context.Background()
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			ok, err := store.Canary(ctx, "css_fix", fmt.Sprintf("t%d", i), time.Now(), trust.Policy{}, trust.Stats{})
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	st, err := store.Get(ctx, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	places := trust.Policy{}.WithDefaults().Canary // one round: MinOutcomes
	if admitted != places || len(st.Canaries) != places {
		t.Fatalf("%d admitted, %d places held, want %d", admitted, len(st.Canaries), places)
	}
	if _, err := store.Release(ctx, "css_fix", st.Canaries[0].Key); err != nil {
		t.Fatal(err)
	}
	if ok, err := store.Canary(ctx, "css_fix", "late", time.Now(), trust.Policy{}, trust.Stats{}); err != nil || !ok {
		t.Fatalf("a freed place was not given: %v %v", ok, err)
	}
}
