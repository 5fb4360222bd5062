package scoring_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

// A retry climbs onto a rung its type has measured too few retries on
// only through one of the rung's places; a place is free again once its
// retry's outcome is in the window or it expired.
func TestPolicyAdmitRung(t *testing.T) {
	now := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	const refine, pivot = events.RungRefine, events.RungPivot
	place := func(key string, rung events.Rung, age time.Duration) scoring.Canary {
		return scoring.Canary{Key: key, Rung: rung, At: now.Add(-age), Pass: 2} // the pass the table's claims are made on
	}
	retried := func(task string, rung events.Rung) scoring.Outcome {
		return scoring.Outcome{Key: task + ":2:outcome", Task: task, Rung: rung, Retry: true, At: now.Add(-time.Second)}
	}
	won := func(task string, rung events.Rung) scoring.Outcome {
		o := retried(task, rung)
		o.Success = true
		return o
	}
	tests := []struct {
		name          string
		p             scoring.Policy
		s             scoring.Stats
		key           string
		rung          events.Rung
		admit, change bool
		left          int // places held afterwards
	}{
		{"the first retry onto the rung takes its place", scoring.Policy{}, scoring.Stats{}, "t1", refine, true, true, 1},
		{"the place is taken", scoring.Policy{}, scoring.Stats{Rungs: []scoring.Canary{place("t1", refine, time.Second)}}, "t2", refine, false, false, 1},
		{"a redelivery keeps its place", scoring.Policy{}, scoring.Stats{Rungs: []scoring.Canary{place("t1", refine, time.Second)}}, "t1", refine, true, false, 1},
		{"another rung has places of its own", scoring.Policy{}, scoring.Stats{Rungs: []scoring.Canary{place("t1", refine, time.Second)}}, "t2", pivot, true, true, 2},
		{"a retry on the rung succeeded: no place needed", scoring.Policy{}, scoring.Stats{Outcomes: []scoring.Outcome{won("t0", refine)}}, "t2", refine, true, false, 0},
		{"its first retry failed: the next is a canary too", scoring.Policy{}, scoring.Stats{Outcomes: []scoring.Outcome{retried("t0", refine)}}, "t2", refine, true, true, 1},
		{"its first retry failed: one canary at a time", scoring.Policy{},
			scoring.Stats{Outcomes: []scoring.Outcome{retried("t0", refine)}, Rungs: []scoring.Canary{place("t1", refine, time.Second)}}, "t2", refine, false, false, 1},
		{"as many failed retries as judge the rung: no place needed", scoring.Policy{RungMinSamples: 3},
			scoring.Stats{Outcomes: []scoring.Outcome{retried("t0", refine), retried("t1", refine), retried("t3", refine)}, Rungs: []scoring.Canary{place("t4", refine, time.Second)}}, "t2", refine, true, false, 1},
		{"no rung floor: one failed retry measures the rung", scoring.Policy{RungFloor: -1}, scoring.Stats{Outcomes: []scoring.Outcome{retried("t0", refine)}}, "t2", refine, true, false, 0},
		{"a first attempt measures no rung", scoring.Policy{}, scoring.Stats{Outcomes: []scoring.Outcome{{Key: "t0:1:outcome", Task: "t0", Rung: refine}}, Rungs: []scoring.Canary{place("t1", refine, time.Second)}}, "t2", refine, false, false, 1},
		{"an expired place is given up", scoring.Policy{}, scoring.Stats{Rungs: []scoring.Canary{place("t1", refine, scoring.DefaultCanaryTTL)}}, "t2", refine, true, true, 1},
		{"two places", scoring.Policy{RungCanary: 2}, scoring.Stats{Rungs: []scoring.Canary{place("t1", refine, time.Second)}}, "t2", refine, true, true, 2},
		{"two places, one retry measured: still thin", scoring.Policy{RungCanary: 2},
			scoring.Stats{Outcomes: []scoring.Outcome{retried("t1", refine)}, Rungs: []scoring.Canary{place("t1", refine, time.Second), place("t3", refine, time.Second)}}, "t2", refine, true, true, 2},
		{"a place kept before passes were: freed by any retry of its task on the rung", scoring.Policy{},
			scoring.Stats{Outcomes: []scoring.Outcome{retried("t1", refine)}, Rungs: []scoring.Canary{{Key: "t1", Rung: refine, At: now.Add(-time.Second)}}}, "t2", refine, true, true, 1},
		{"off", scoring.Policy{RungCanary: -1}, scoring.Stats{Rungs: []scoring.Canary{place("t1", refine, time.Second)}}, "t2", refine, true, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(tt.s.Rungs)
			next, admit, changed := tt.p.AdmitRung(tt.s, tt.key, 2, tt.rung, now)
			if admit != tt.admit || changed != tt.change || len(next.Rungs) != tt.left {
				t.Fatalf("admit=%v changed=%v places=%d, want %v %v %d", admit, changed, len(next.Rungs), tt.admit, tt.change, tt.left)
			}
			if len(tt.s.Rungs) != before {
				t.Fatal("the input was modified")
			}
		})
	}
}

// A task's next retry on a rung its earlier retry failed on holds a place
// of its own: the earlier retry's outcome does not free it, so the other
// waiting retries still go one at a time.
func TestAdmitRungATasksNextRetryHoldsItsOwnPlace(t *testing.T) {
	now := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	const pivot = events.RungPivot
	p := scoring.Policy{}
	s := scoring.Stats{Outcomes: []scoring.Outcome{{Key: "t1:3:outcome", Task: "t1", Rung: pivot, Retry: true, At: now.Add(-time.Second)}},
		Rungs: []scoring.Canary{{Key: "t1", Rung: pivot, At: now.Add(-2 * time.Second), Pass: 3}}}
	next, admit, changed := p.AdmitRung(s, "t1", 4, pivot, now)
	if !admit || !changed || len(next.Rungs) != 1 || next.Rungs[0].Pass != 4 {
		t.Fatalf("t1's pass 4: admit=%v changed=%v places %+v, want its own place (pass 4) in place of pass 3's", admit, changed, next.Rungs)
	}
	if n := p.RungPlaces(next, pivot, now, ""); n != 1 {
		t.Fatalf("RungPlaces = %d, want 1: pass 4's place is in flight", n)
	}
	if _, admit, _ := p.AdmitRung(next, "t2", 2, pivot, now); admit {
		t.Fatal("t2 climbed beside t1's pass 4: the rung is climbed more than one canary at a time")
	}
	if _, admit, changed := p.AdmitRung(next, "t1", 4, pivot, now); !admit || changed {
		t.Fatalf("pass 4 redelivered: admit=%v changed=%v, want its place kept", admit, changed)
	}
}

// Release gives up a task's canary place and its rung places together.
func TestReleaseRungPlaces(t *testing.T) {
	now := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	s := scoring.Stats{
		Canaries: []scoring.Canary{{Key: "t1", At: now}},
		Rungs:    []scoring.Canary{{Key: "t1", Rung: events.RungRefine, At: now}, {Key: "t2", Rung: events.RungRefine, At: now}},
	}
	if !s.Holds("t1") || !s.Holds("t2") || s.Holds("t3") {
		t.Fatal("Holds does not see the places")
	}
	next, changed := scoring.Release(s, "t1")
	if !changed || next.Canaries != nil || len(next.Rungs) != 1 || next.Rungs[0].Key != "t2" {
		t.Fatalf("release: changed=%v canaries %+v rungs %+v", changed, next.Canaries, next.Rungs)
	}
	if len(s.Rungs) != 2 {
		t.Fatal("the input was modified")
	}
	if _, changed := scoring.Release(next, "t1"); changed {
		t.Fatal("releasing a task without places changed the stats")
	}
}

// ReleaseBefore gives up only the rung places a task holds for passes
// before the one it is on: its canary place, its place for the current
// pass, places kept before passes were (pass 0) and other tasks' stay.
func TestReleaseBeforeKeepsTheCurrentPass(t *testing.T) {
	now := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	s := scoring.Stats{
		Canaries: []scoring.Canary{{Key: "t1", At: now}},
		Rungs: []scoring.Canary{
			{Key: "t1", Rung: events.RungRefine, Pass: 2, At: now},
			{Key: "t1", Rung: events.RungPivot, Pass: 3, At: now},
			{Key: "t1", Rung: events.RungResearch, At: now},
			{Key: "t2", Rung: events.RungRefine, Pass: 2, At: now},
		},
	}
	tests := []struct {
		name    string
		key     string
		pass    int
		changed bool
		left    []string // the rung places left, as key/rung/pass
	}{
		{"a place of an earlier pass goes", "t1", 3, true, []string{"t1/PIVOT/3", "t1/RESEARCH/0", "t2/REFINE/2"}},
		{"every earlier pass", "t1", 4, true, []string{"t1/RESEARCH/0", "t2/REFINE/2"}},
		{"the current pass stays", "t1", 2, false, nil},
		{"a task without places", "t3", 9, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next, changed := scoring.ReleaseBefore(s, tc.key, tc.pass)
			if changed != tc.changed {
				t.Fatalf("changed = %v, want %v", changed, tc.changed)
			}
			if !changed {
				return
			}
			var left []string
			for _, c := range next.Rungs {
				left = append(left, fmt.Sprintf("%s/%s/%d", c.Key, c.Rung, c.Pass))
			}
			if !slices.Equal(left, tc.left) || len(next.Canaries) != 1 {
				t.Fatalf("left %v and %d canary places, want %v and 1", left, len(next.Canaries), tc.left)
			}
			if len(s.Rungs) != 4 {
				t.Fatal("the input was modified")
			}
		})
	}
}
