package scoring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// randomWindow is a window of n outcomes of up to tasks tasks, their
// attempts interleaved and out of order as concurrent recorders leave them.
func randomWindow(r *rand.Rand, n, tasks int) []Outcome {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rungs := []events.Rung{"", events.RungRefine, events.RungPivot}
	out := make([]Outcome, n)
	for i := range out {
		t := fmt.Sprintf("t%d", r.IntN(tasks))
		out[i] = Outcome{
			Key: fmt.Sprintf("%s:%d:outcome", t, i), Task: t, Success: r.IntN(3) == 0, End: r.IntN(3) == 0,
			Retry: r.IntN(2) == 0, Rung: rungs[r.IntN(len(rungs))], Probe: r.IntN(9) == 0, Held: r.IntN(9) == 0,
			Marker: r.IntN(15) == 0, At: at.Add(time.Duration(r.IntN(n)) * time.Second),
		}
		if r.IntN(20) == 0 {
			out[i].Task = "" // recorded before outcomes named their task
		}
	}
	return out
}

// The fold's task index of each outcome names that outcome's task, in the
// order Tasks returns, whether or not each task's outcomes are together.
func TestFoldIndexesEachOutcomesTask(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		os := randomWindow(r, 1+r.IntN(60), 1+r.IntN(30))
		rs, of := fold(os)
		if !slices.Equal(rs, Tasks(os)) {
			t.Fatal("fold and Tasks disagree")
		}
		for n, o := range os {
			if rs[of[n]].Task != o.TaskID() {
				t.Fatalf("outcome %d of %s indexed to %s", n, o.TaskID(), rs[of[n]].Task)
			}
		}
	}
}

// A Fold answers for the slice it was made for, once; another slice, even
// one appended to it, is folded afresh.
func TestFoldAnswersOnlyForItsSlice(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	os := randomWindow(r, 20, 8)
	s := Stats{Outcomes: os[:19:19]}
	s.Fold = NewFold(s.Outcomes)
	a, b := s.Folded(), s.Folded()
	if &a[0] != &b[0] {
		t.Fatal("a Fold folded its slice twice")
	}
	if !slices.Equal(a, Tasks(os[:19])) {
		t.Fatal("a Fold's results differ from Tasks")
	}
	for name, other := range map[string][]Outcome{"appended": append(s.Outcomes, os[19]), "shorter": os[:18], "moved": os[1:20], "copied": slices.Clone(os[:19]), "empty": nil} {
		s2 := s
		s2.Outcomes = other
		if got := s2.Folded(); !slices.Equal(got, Tasks(other)) {
			t.Errorf("%s: the Fold of another slice answered for it", name)
		}
	}
}

// windowOutcomes and failedRun give what the straightforward versions
// they replaced gave (below: the outcomes of the newest window tasks by a
// set of their ids; the run over a copy of the settled tasks).
func TestWindowOutcomesAndFailedRunAsBefore(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	prior := Prior{Mean: 0.8, Weight: 10, Types: 4}
	for range 500 {
		os := randomWindow(r, 1+r.IntN(120), 1+r.IntN(80))
		p := Policy{Window: 1 + r.IntN(60)}.WithDefaults()
		s := Stats{Outcomes: os, Fold: NewFold(os)}
		if got, want := slices.Collect(p.windowOutcomes(s)), windowOutcomesBefore(p, os); !slices.Equal(got, want) {
			t.Fatalf("window %d: windowOutcomes %d outcomes, before %d", p.Window, len(got), len(want))
		}
		rs := p.window(s.Folded(), false)
		for _, pr := range []Prior{{}, prior} {
			k, stop, pooled := failedRun(rs, 0.05, 3, pr)
			k0, stop0, pooled0 := failedRunBefore(rs, 0.05, 3, pr)
			if k != k0 || stop != stop0 || pooled != pooled0 {
				t.Fatalf("failedRun %d %v %v, before %d %v %v", k, stop, pooled, k0, stop0, pooled0)
			}
		}
	}
}

func windowOutcomesBefore(p Policy, outcomes []Outcome) []Outcome {
	folded := Tasks(outcomes)
	if len(folded) <= p.Window {
		return outcomes
	}
	keep := map[string]bool{}
	for _, r := range lastN(folded, p.Window) {
		keep[r.Task] = true
	}
	var out []Outcome
	for _, o := range outcomes {
		if keep[o.TaskID()] {
			out = append(out, o)
		}
	}
	return out
}

func failedRunBefore(rs []TaskResult, alpha float64, minBefore int, prior Prior) (k int, stopped, pooled bool) {
	var settled []TaskResult
	for _, r := range rs {
		if r.Settled() && !r.backlog() {
			settled = append(settled, r)
		}
	}
	for k < len(settled) && !settled[len(settled)-1-k].Success {
		k++
	}
	if k == 0 || alpha <= 0 {
		return k, false, false
	}
	before := settled[:len(settled)-k]
	ok := 0
	for _, r := range before {
		if r.Success {
			ok++
		}
	}
	seen, won := float64(len(before)), float64(ok)
	if len(before) < max(minBefore, 1) {
		if !prior.Known() {
			return k, false, false
		}
		seen, won, pooled = seen+prior.Weight, won+prior.Weight*prior.Mean, true
	}
	fail := 1 - (won+1)/(seen+2)
	return k, math.Pow(fail, float64(k)) < alpha, pooled
}

// Readers share a Fold without a lock (a View hands it to every gate
// worker): it folds once, and each sees the whole result (run with -race).
func TestFoldSharedByReaders(t *testing.T) {
	os := randomWindow(rand.New(rand.NewPCG(7, 8)), 100, 40)
	s := Stats{Outcomes: os, Fold: NewFold(os)}
	want := Tasks(os)
	got := make(chan []TaskResult, 8)
	for range cap(got) {
		go func() { got <- s.Folded() }()
	}
	first := <-got
	for range cap(got) - 1 {
		if rs := <-got; &rs[0] != &first[0] {
			t.Fatal("readers folded the window more than once")
		}
	}
	if !slices.Equal(first, want) {
		t.Fatal("the shared fold differs from Tasks")
	}
}
