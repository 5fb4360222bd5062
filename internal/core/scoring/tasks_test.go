package scoring_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

var t0 = time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)

// ladder is one task's attempts, oldest first: S succeeds, F fails; end
// marks the last failure as the end of its ladder.
func ladder(id string, start int, pattern string, end bool) []scoring.Outcome {
	var out []scoring.Outcome
	for i, c := range pattern {
		o := scoring.Outcome{
			Key: fmt.Sprintf("%s:%d:outcome", id, i+1), Task: id, Success: c == 'S',
			At: t0.Add(time.Duration(start+i) * time.Second), Retry: i > 0, Rung: events.RungRefine,
		}
		o.End = c == 'S' || (end && i == len(pattern)-1) // a success ends the task
		out = append(out, o)
	}
	return out
}

// window orders outcomes as a type's window keeps them (by time, then key).
func window(outcomes []scoring.Outcome) []scoring.Outcome {
	var w []scoring.Outcome
	for _, o := range outcomes {
		w, _ = scoring.Insert(w, o, 1000)
	}
	return w
}

func TestTasksFoldAttempts(t *testing.T) {
	var all []scoring.Outcome
	all = append(all, ladder("a", 0, "FFS", false)...)
	all = append(all, ladder("b", 1, "FFFFFFF", true)...)
	all = append(all, ladder("c", 2, "FF", false)...)
	all = append(all, scoring.EndMarker("c", 3, t0.Add(time.Minute)))
	got := scoring.Tasks(window(all))
	want := []scoring.TaskResult{
		{Task: "a", Success: true, Ended: true, Failures: 2, At: t0.Add(2 * time.Second)},
		{Task: "b", Ended: true, Failures: 7, At: t0.Add(7 * time.Second)},
		{Task: "c", Ended: true, Failures: 2, At: t0.Add(time.Minute)},
	}
	if len(got) != len(want) {
		t.Fatalf("%d tasks, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("task %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// Tasks are ordered by their newest outcome: a task retried after
// another began comes after it.
func TestTasksOrderByNewestOutcome(t *testing.T) {
	all := []scoring.Outcome{
		{Key: "a:1:outcome", Task: "a", At: t0},
		{Key: "b:1:outcome", Task: "b", At: t0.Add(time.Second)},
		{Key: "a:2:outcome", Task: "a", At: t0.Add(2 * time.Second), Retry: true},
	}
	got := scoring.Tasks(window(all))
	if len(got) != 2 || got[0].Task != "b" || got[1].Task != "a" || got[1].Failures != 2 {
		t.Fatalf("Tasks = %+v, want b then a (2 failures)", got)
	}
}

// The SPEC §4 rule that motivated task weighing: one hard task climbing 7
// rungs is one failure of its type, not seven.
func TestAHardTaskIsOneFailure(t *testing.T) {
	var all []scoring.Outcome
	for i := range 10 {
		all = append(all, ladder(fmt.Sprintf("ok%d", i), i, "S", false)...)
	}
	all = append(all, ladder("hard", 20, "FFFFFFF", true)...)
	v := scoring.Policy{}.Evaluate("css_fix", scoring.Stats{Outcomes: all})
	if v.Below || v.Outcomes != 11 || v.Failures != 1 {
		t.Fatalf("%+v: want 11 tasks, 1 failure, not below", v)
	}
	// Per attempt the same window would score 10 of 17.
}

// A pipeline step that passed is no success of its task: the task succeeds
// when the attempt that succeeded ended it.
func TestAPassedStepIsNoTaskSuccess(t *testing.T) {
	var all []scoring.Outcome
	for i := range 12 {
		id := fmt.Sprintf("p%d", i)
		all = append(all,
			scoring.Outcome{Key: id + ":1:outcome", Task: id, Success: true, At: t0.Add(time.Duration(3*i) * time.Second)}, // plan passed
			scoring.Outcome{Key: id + ":2:outcome", Task: id, At: t0.Add(time.Duration(3*i+1) * time.Second)},              // implement failed
			scoring.Outcome{Key: id + ":3:outcome", Task: id, End: true, At: t0.Add(time.Duration(3*i+2) * time.Second)})   // and the task failed
	}
	if v := (scoring.Policy{}).Evaluate("pipe", scoring.Stats{Outcomes: all}); !v.Below || v.Successes != 0 {
		t.Fatalf("12 pipelines that failed after their first step: %+v", v)
	}
}

// Outcomes recorded before they named their task are tasks of their own,
// ended: a type gated before the upgrade stays gated.
func TestOutcomesWithoutTaskAreEndedTasks(t *testing.T) {
	var all []scoring.Outcome
	for i := range 12 {
		all = append(all, scoring.Outcome{Key: fmt.Sprintf("old%d:1:outcome", i), At: t0.Add(time.Duration(i) * time.Second)})
	}
	if v := (scoring.Policy{}).Evaluate("old", scoring.Stats{Outcomes: all}); !v.Below || v.Settled != 12 {
		t.Fatalf("12 old failures: %+v", v)
	}
}

func TestEvaluateWith(t *testing.T) {
	healthyMesh := scoring.Prior{Mean: 0.9, Weight: 10, Types: 8}
	splitMesh := scoring.Prior{Mean: 0.7, Weight: 0.5, Types: 30}
	failed := func(n int) []scoring.Outcome {
		var out []scoring.Outcome
		for i := range n {
			out = append(out, ladder(fmt.Sprintf("f%d", i), i*10, "FF", true)...)
		}
		return out
	}
	climbing := func(n int) []scoring.Outcome { // first attempts failed, ladders in flight
		var out []scoring.Outcome
		for i := range n {
			out = append(out, ladder(fmt.Sprintf("c%d", i), i, "F", false)...)
		}
		return out
	}
	// 1 of 5 tasks succeeded, then 4 failed: at the prior's 0.9 alone the
	// run would hold the type, at its own 1 in 5 it is no surprise.
	weakThenFailed := append(append(failed(4), ladder("s", 45, "S", true)...), prefixed("r", 50, failed(4))...)
	// 30 held tasks re-admitted and succeeded, then 3 of 6 of its own, then
	// 6 failed: 39 settled, no longer unproven, so the run is read against
	// its own tasks (too few to test), not the prior (0.28^6 would hold it).
	var provenThenFailed []scoring.Outcome
	for i := range 30 {
		o := ladder(fmt.Sprintf("b%d", i), i, "S", true)
		o[0].Held = true
		provenThenFailed = append(provenThenFailed, o...)
	}
	for i := range 6 {
		provenThenFailed = append(provenThenFailed, ladder(fmt.Sprintf("h%d", i), 100+i*10, map[bool]string{true: "S", false: "FF"}[i%2 == 1], true)...)
	}
	provenThenFailed = append(provenThenFailed, prefixed("r", 200, failed(6))...)
	tests := []struct {
		name     string
		outcomes []scoring.Outcome
		prior    scoring.Prior
		settled  bool
		below    bool
		reason   string
	}{
		{"no prior: a new type is never gated on its own evidence", failed(5), scoring.Prior{}, false, false, ""},
		{"types either healthy or hopeless: 2 failed tasks gate", failed(2), splitMesh, false, true, "pooled with 30 types' rate 0.70"},
		{"  but 1 does not", failed(1), splitMesh, false, false, ""},
		{"a healthy mesh presumes a new type healthy", failed(3), healthyMesh, false, false, ""},
		{"  until its first tasks all fail, a run unlikely at the mesh's rate", failed(4), healthyMesh, false, true, "its last 4 tasks failed, unlikely at its rate before pooled with 8 other types' rate 0.90"},
		{"  and once its own 10 settled tasks speak, by its score", failed(10), healthyMesh, false, true, "trust score 0.00 below"},
		{"its own tasks before the run count with the prior", weakThenFailed, healthyMesh, false, false, ""},
		{"a proven type's run is read without the prior", provenThenFailed, healthyMesh, false, false, ""},
		{"a retry is judged on settled tasks: siblings climbing do not stop it", climbing(10), splitMesh, true, false, ""},
		{"a new task counts them as failed so far", climbing(10), splitMesh, false, true, ""},
	}
	for _, tt := range tests {
		t.Run(strings.TrimSpace(tt.name), func(t *testing.T) {
			v := scoring.Policy{}.EvaluateWith("css_fix", scoring.Stats{Outcomes: tt.outcomes}, tt.prior, tt.settled)
			if v.Below != tt.below || !strings.Contains(v.Reason, tt.reason) {
				t.Fatalf("%+v; want below=%v with %q", v, tt.below, tt.reason)
			}
		})
	}
}

// prefixed renames outcomes' tasks with prefix and moves them start
// seconds later, so one helper's tasks can follow another's.
func prefixed(prefix string, start int, os []scoring.Outcome) []scoring.Outcome {
	out := make([]scoring.Outcome, len(os))
	for i, o := range os {
		o.Task = prefix + o.Task
		o.Key = prefix + o.Key
		o.At = o.At.Add(time.Duration(start) * time.Second)
		out[i] = o
	}
	return out
}

// A run of failures a type's history makes unlikely stops it at once: a
// regression after 40 successes in 2 tasks; a type that fails half the
// time only after a run its rate does not explain.
func TestARegressionStopsTheTypeInAFewTasks(t *testing.T) {
	var all []scoring.Outcome
	for i := range 40 {
		all = append(all, ladder(fmt.Sprintf("ok%d", i), i, "S", false)...)
	}
	p := scoring.Policy{}
	one := append(append([]scoring.Outcome{}, all...), ladder("r1", 100, "F", true)...)
	if v := p.Evaluate("css_fix", scoring.Stats{Outcomes: one}); v.Below {
		t.Fatalf("one failure after 40 successes stopped the type: %+v", v)
	}
	two := append(one, ladder("r2", 101, "F", true)...)
	v := p.Evaluate("css_fix", scoring.Stats{Outcomes: two})
	if !v.Below || v.Run != 2 || !strings.Contains(v.Reason, "its last 2 tasks failed") {
		t.Fatalf("two failures after 40 successes: %+v", v)
	}
	// Half of 40 succeeded: 9 failures in a row happen more than 1 in
	// 1,000 times, 10 do not.
	var half []scoring.Outcome
	for i := range 40 {
		half = append(half, ladder(fmt.Sprintf("h%d", i), i, map[bool]string{true: "S", false: "F"}[i%2 == 1], true)...)
	}
	for i := range 10 {
		half = append(half, ladder(fmt.Sprintf("x%d", i), 100+i, "F", true)...)
		v := p.Evaluate("css_fix", scoring.Stats{Outcomes: half})
		if want := i+1 >= 10; v.Below != want {
			t.Fatalf("%d failures in a row at a 50%% rate: below=%v, want %v (%+v)", i+1, v.Below, want, v)
		}
	}
}

// A probe's success re-opens a gated type; the next failure closes it.
func TestAProbeWinReopensTheType(t *testing.T) {
	all := failedTasks(12)
	p := scoring.Policy{}
	if !p.Evaluate("css_fix", scoring.Stats{Outcomes: all}).Below {
		t.Fatal("12 failed tasks: not below")
	}
	win := scoring.Outcome{Key: "p:1:outcome", Task: "p", Success: true, Probe: true, End: true, At: t0.Add(time.Hour)}
	all = append(all, win)
	if v := p.Evaluate("css_fix", scoring.Stats{Outcomes: all}); v.Below || !v.Opened {
		t.Fatalf("after a probe's win: %+v", v)
	}
	if v := p.Evaluate("css_fix", scoring.Stats{Outcomes: append(all, ladder("ok", 3700, "S", false)...)}); v.Below {
		t.Fatalf("a success after the probe closed it: %+v", v)
	}
	all = append(all, ladder("bad", 3800, "F", true)...)
	if v := p.Evaluate("css_fix", scoring.Stats{Outcomes: all}); !v.Below || v.Opened {
		t.Fatalf("a failure right after the probe kept it open: %+v", v)
	}
}

func failedTasks(n int) []scoring.Outcome {
	var out []scoring.Outcome
	for i := range n {
		out = append(out, ladder(fmt.Sprintf("f%d", i), i, "F", true)...)
	}
	return out
}

// Held tasks send one probe per interval, the interval doubling with each
// probe that failed, counted from the type's newest failure.
func TestHeldProbeSpacing(t *testing.T) {
	p := scoring.Policy{ProbeInterval: 10 * time.Second}
	s := scoring.Stats{Outcomes: failedTasks(12)} // newest at t0+11s
	newest := t0.Add(11 * time.Second)
	if _, probe := p.HeldProbe(s, newest.Add(5*time.Second)); probe {
		t.Fatal("probed 5s after the type's newest failure")
	}
	s, probe := p.HeldProbe(s, newest.Add(10*time.Second))
	if !probe || !s.ProbeAt.Equal(newest.Add(10*time.Second)) {
		t.Fatalf("no probe 10s after: %v %+v", probe, s.ProbeAt)
	}
	if _, probe := p.HeldProbe(s, newest.Add(15*time.Second)); probe {
		t.Fatal("a second probe within the interval")
	}
	// The probe failed: the next waits twice as long.
	s.Outcomes = append(s.Outcomes, scoring.Outcome{Key: "p:1:outcome", Task: "p", Probe: true, End: true, At: newest.Add(11 * time.Second)})
	if _, probe := p.HeldProbe(s, newest.Add(25*time.Second)); probe {
		t.Fatal("probed 14s after a failed probe (want 20s)")
	}
	if _, probe := p.HeldProbe(s, newest.Add(32*time.Second)); !probe {
		t.Fatal("no probe 21s after a failed probe")
	}
	// A paused held backlog re-admits at the same pace, doubling for each
	// re-admitted task that failed past BacklogStop.
	paused := scoring.Stats{Outcomes: append(append(failedTasks(12), readmitted("h1", 12, "F", true)...), readmitted("h2", 13, "F", true)...)}
	last := t0.Add(13 * time.Second)
	if _, probe := p.HeldProbe(paused, last.Add(10*time.Second)); !probe {
		t.Fatal("a paused backlog: nothing re-admitted 10s after its newest failure")
	}
	paused.Outcomes = append(paused.Outcomes, readmitted("h3", 14, "F", true)...)
	last = t0.Add(14 * time.Second)
	if _, probe := p.HeldProbe(paused, last.Add(15*time.Second)); probe {
		t.Fatal("a third re-admitted failure: re-admitted again within 20s")
	}
	if _, probe := p.HeldProbe(paused, last.Add(20*time.Second)); !probe {
		t.Fatal("a third re-admitted failure: nothing re-admitted after 20s")
	}
	// Successes since (the type's new tasks, its backlog paused) do not
	// put the next probe off: the interval counts from the newest failure.
	ok := scoring.Stats{Outcomes: append(failedTasks(12), ladder("ok", 15, "S", false)...)}
	if _, probe := p.HeldProbe(ok, newest.Add(10*time.Second)); !probe {
		t.Fatal("a success after the newest failure put the probe off")
	}
}

func TestPoolPrior(t *testing.T) {
	rate := func(typ string, ok, n int) scoring.Stats {
		var out []scoring.Outcome
		for i := range n {
			c := "F"
			if i < ok {
				c = "S"
			}
			out = append(out, ladder(fmt.Sprintf("%s%d", typ, i), i, c, true)...)
		}
		return scoring.Stats{Type: typ, Outcomes: out}
	}
	alike := scoring.NewPool([]scoring.Stats{rate("a", 9, 10), rate("b", 8, 10), rate("c", 9, 10), rate("d", 8, 10)}, scoring.Policy{})
	split := scoring.NewPool([]scoring.Stats{rate("a", 10, 10), rate("b", 0, 10), rate("c", 10, 10), rate("d", 10, 10), rate("e", 0, 10)}, scoring.Policy{})
	few := scoring.NewPool([]scoring.Stats{rate("a", 10, 10), rate("b", 10, 10)}, scoring.Policy{})
	if pr := alike.Prior("new"); !pr.Known() || pr.Weight < 5 || pr.Mean < 0.8 {
		t.Errorf("types alike: %+v, want a strong prior near 0.85", pr)
	}
	if pr := split.Prior("new"); !pr.Known() || pr.Weight != scoring.MinPriorWeight {
		t.Errorf("types healthy or hopeless: %+v, want the weakest prior", pr)
	}
	if pr := few.Prior("new"); pr.Known() {
		t.Errorf("two types: %+v, want no prior", pr)
	}
	if pr := alike.Prior("a"); pr.Types != 3 {
		t.Errorf("a type's own rate is left out of its prior: %+v", pr)
	}
	if n := split.Prior("new").Sample(0.15); n != 2 {
		t.Errorf("split mesh: %d canaries decide a new type, want 2", n)
	}
}

// A type with few retries of its own borrows the other types' rate: in a
// mesh where retries never pay, its first retries are handed off — but a
// share climbs anyway, so the rung keeps being measured: at most one in
// RungExplore, fewer the more the rung was measured to fail.
func TestRungBelowWithPool(t *testing.T) {
	retries := func(typ string, rung events.Rung, ok, n int) scoring.Stats {
		var out []scoring.Outcome
		for i := range n {
			out = append(out, scoring.Outcome{Key: fmt.Sprintf("%s%d:2:outcome", typ, i), Task: fmt.Sprintf("%s%d", typ, i), Retry: true, Rung: rung, Success: i < ok, At: t0})
		}
		return scoring.Stats{Type: typ, Outcomes: out}
	}
	never := scoring.NewPool([]scoring.Stats{retries("a", events.RungRefine, 0, 6), retries("b", events.RungRefine, 0, 6)}, scoring.Policy{})
	often := scoring.NewPool([]scoring.Stats{retries("a", events.RungRefine, 5, 6), retries("b", events.RungRefine, 4, 6)}, scoring.Policy{})
	p := scoring.Policy{}
	fresh := scoring.Stats{Type: "new"}
	if below, _, _ := p.RungBelowWith(fresh, events.RungRefine, often, ""); below {
		t.Error("retries pay elsewhere: a new type's retry was stopped")
	}
	if below, _, _ := p.RungBelowWith(fresh, events.RungRefine, never, ""); !below {
		t.Error("retries never pay elsewhere: a new type's retry went")
	}
	// PIVOT nobody measured: the pool's retries on every rung stand in.
	if below, _, _ := p.RungBelowWith(fresh, events.RungPivot, never, ""); !below {
		t.Error("an unmeasured rung in a mesh where retries never pay: went")
	}
	// Explored: a share that shrinks as the pool's failures mount.
	thin := scoring.NewPool([]scoring.Stats{retries("a", events.RungRefine, 0, 1), retries("b", events.RungRefine, 0, 1)}, scoring.Policy{})
	deep := scoring.NewPool([]scoring.Stats{retries("a", events.RungRefine, 0, 25), retries("b", events.RungRefine, 0, 25)}, scoring.Policy{})
	for _, tt := range []struct {
		name     string
		pool     *scoring.Pool
		min, max int // of 1,000 retries
	}{
		{"2 failed retries pooled: too few to shut the rung", thin, 1000, 1000},
		{"12 failed: 0.75^13 ≈ 2.4%", never, 10, 45},
		{"50 failed: almost none", deep, 0, 2},
	} {
		explored := 0
		for i := range 1000 {
			if below, _, _ := p.RungBelowWith(fresh, events.RungRefine, tt.pool, fmt.Sprintf("t%d:2:explore", i)); !below {
				explored++
			}
		}
		if explored < tt.min || explored > tt.max {
			t.Errorf("%s: %d of 1000 retries explored, want %d to %d", tt.name, explored, tt.min, tt.max)
		}
	}
	// Retries that failed on one rung say little of the next: a type
	// whose REFINE retries fail climbs onto PIVOT where it pays for the
	// others (a third of the time, above the floor of a quarter).
	pivots := scoring.NewPool([]scoring.Stats{retries("a", events.RungPivot, 0, 6), retries("b", events.RungPivot, 3, 6), retries("c", events.RungPivot, 3, 6)}, scoring.Policy{})
	if below, _, _ := p.RungBelowWith(retries("new", events.RungRefine, 0, 4), events.RungPivot, pivots, ""); below {
		t.Error("4 REFINE retries failed: the type was kept off PIVOT, which pays for the others")
	}
	// Explored as rarely as the type's own retries say: 12 failed on
	// two rungs, however well retries pay for the others.
	hopeless := retries("new", events.RungRefine, 0, 6)
	hopeless.Outcomes = append(hopeless.Outcomes, retries("new2", events.RungPivot, 0, 6).Outcomes...)
	explored := 0
	for i := range 1000 {
		below, _, _ := p.RungBelowWith(hopeless, events.RungResearch, often, fmt.Sprintf("t%d:2:explore", i))
		if !below {
			explored++
		}
	}
	if explored < 10 || explored > 45 { // 0.75^13 ≈ 2.4%
		t.Errorf("every own retry failed: %d of 1000 retries explored a rung, want 10 to 45", explored)
	}
	// Nothing pooled: the ladder applies as it is until the type has
	// RungMinSamples retries of its own; then they stand in.
	alone := scoring.Stats{Type: "new"}
	for n := range p.WithDefaults().RungMinSamples {
		if below, _, _ := p.RungBelowWith(alone, events.RungResearch, nil, ""); below {
			t.Fatalf("nothing pooled: stopped after %d failed retries of its own", n)
		}
		alone.Outcomes = append(alone.Outcomes, scoring.Outcome{Key: fmt.Sprintf("x%d:2:outcome", n), Task: fmt.Sprintf("x%d", n), Retry: true, Rung: events.RungPivot, At: t0.Add(time.Duration(n) * time.Second)})
	}
	if below, _, _ := p.RungBelowWith(alone, events.RungResearch, nil, ""); !below {
		t.Error("nothing pooled, 8 failed retries of its own: went on")
	}
	// A few other types' first retries failing (a burst delivered at once,
	// each type's first retry on the rung) do not shut the rung on a type
	// whose own retry on it succeeded, nor on one whose own failed once:
	// the pooled mean counts as much as the retries behind it.
	three := scoring.NewPool([]scoring.Stats{retries("a", events.RungRefine, 0, 1), retries("b", events.RungRefine, 0, 1), retries("c", events.RungRefine, 0, 1)}, scoring.Policy{})
	two := scoring.NewPool([]scoring.Stats{retries("a", events.RungRefine, 0, 1), retries("b", events.RungRefine, 0, 1)}, scoring.Policy{})
	for _, tt := range []struct {
		name string
		own  scoring.Stats
		rung events.Rung
		pool *scoring.Pool
	}{
		{"its own REFINE retry paid, 3 other types' first failed", retries("new", events.RungRefine, 1, 1), events.RungRefine, three},
		{"its own REFINE retry failed, 2 other types' first failed", retries("new", events.RungRefine, 0, 1), events.RungRefine, two},
		{"PIVOT it never tried, 3 other types' first retries failed", fresh, events.RungPivot, three},
	} {
		if below, _, _ := p.RungBelowWith(tt.own, tt.rung, tt.pool, ""); below {
			t.Errorf("%s: stopped", tt.name)
		}
	}
	// The type's own evidence, once it has enough, decides alone.
	own := retries("new", events.RungRefine, 8, 8)
	if below, _, _ := p.RungBelowWith(own, events.RungRefine, never, ""); below {
		t.Error("8 of 8 own retries succeeded: stopped on the pool's word")
	}
}

// readmitted is one re-admitted held task's attempts (ladder's, marked
// Held).
func readmitted(id string, start int, pattern string, end bool) []scoring.Outcome {
	out := ladder(id, start, pattern, end)
	for i := range out {
		out[i].Held = true
	}
	return out
}

// probed marks a task's attempts as a probe's.
func probed(out []scoring.Outcome) []scoring.Outcome {
	for i := range out {
		out[i].Probe = true
	}
	return out
}

// After a probe's win the held come back two at a time, doubling with
// every re-admitted task that succeeds, up to MinOutcomes; one at a time
// after a re-admitted task failed, none after BacklogStop did in a row.
// The type's new tasks say nothing of its held backlog.
func TestTrialPlaces(t *testing.T) {
	base := failedTasks(12)
	win := scoring.Outcome{Key: "p:1:outcome", Task: "p", Success: true, Probe: true, Held: true, End: true, At: t0.Add(time.Hour)}
	p := scoring.Policy{}
	for _, tt := range []struct {
		pattern string // re-admitted tasks after the win, oldest first: S succeeded, F failed
		fresh   int    // new tasks that succeeded after them
		want    int
	}{
		{"", 0, 2}, {"S", 0, 4}, {"SS", 0, 8}, {"SSS", 0, 10}, {"SSSSSS", 0, 10},
		{"", 6, 2},              // new tasks' wins open no more places
		{"SSSF", 0, 1},          // the newest failed: one at a time
		{"SSFF", 3, 0},          // two in a row: only probes
		{"FFS", 0, 4},           // a win since: the slow start again
		{"FFFFFFFFFFFFF", 0, 0}, // a backlog that keeps failing
	} {
		all := append(append([]scoring.Outcome{}, base...), win)
		for i, c := range tt.pattern {
			all = append(all, readmitted(fmt.Sprintf("h%d", i), 3700+i, string(c), true)...)
		}
		for i := range tt.fresh {
			all = append(all, ladder(fmt.Sprintf("ok%d", i), 3800+i, "S", false)...)
		}
		if got := p.TrialPlaces(scoring.Stats{Outcomes: all}); got != tt.want {
			t.Errorf("re-admitted %q, then %d new wins: %d places, want %d", tt.pattern, tt.fresh, got, tt.want)
		}
		if v := p.Evaluate("css_fix", scoring.Stats{Outcomes: all}); tt.pattern == "" && tt.fresh == 0 && !v.Probation {
			t.Errorf("right after the win: not on probation: %+v", v)
		}
	}
}

// The held backlog's record: re-admitted tasks only, newest first, a task
// still climbing its ladder counting as failed so far.
func TestBacklogOf(t *testing.T) {
	p := scoring.Policy{}
	for _, tt := range []struct {
		name    string
		tasks   [][]scoring.Outcome
		want    scoring.Backlog
		cleared bool
	}{
		{name: "none", tasks: [][]scoring.Outcome{ladder("a", 0, "FFF", true)}},
		{name: "two failed in a row: paused", tasks: [][]scoring.Outcome{readmitted("a", 0, "S", false), readmitted("b", 1, "F", true), readmitted("c", 2, "F", true)},
			want: scoring.Backlog{Losses: 2, Ended: 2, Failed: true}},
		{name: "one still climbing counts as failed so far, not as ended", tasks: [][]scoring.Outcome{readmitted("a", 0, "S", false), readmitted("b", 1, "FF", false)},
			want: scoring.Backlog{Losses: 1, Failed: true}},
		{name: "new tasks between do not count", tasks: [][]scoring.Outcome{readmitted("a", 0, "F", true), ladder("n", 1, "S", false), readmitted("b", 2, "F", true)},
			want: scoring.Backlog{Losses: 2, Ended: 2, Failed: true}},
		{name: "wins since a failure", tasks: [][]scoring.Outcome{readmitted("a", 0, "F", true), readmitted("b", 1, "S", false), readmitted("c", 2, "FS", false)},
			want: scoring.Backlog{Wins: 2, Failed: true}},
		{name: "probes a type below takes from its held tasks judge the type, not the backlog",
			tasks: [][]scoring.Outcome{probed(readmitted("p1", 0, "F", true)), probed(readmitted("p2", 1, "FF", true))}},
		{name: "a pipeline whose first step passed has failed nothing", tasks: [][]scoring.Outcome{readmitted("a", 0, "F", true),
			{{Key: "pipe:1:outcome", Task: "pipe", Held: true, Success: true, At: t0.Add(5 * time.Second)}}},
			want: scoring.Backlog{Losses: 1, Ended: 1, Failed: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var all []scoring.Outcome
			for _, o := range tt.tasks {
				all = append(all, o...)
			}
			got := p.BacklogOf(scoring.Stats{Outcomes: window(all)})
			if got != tt.want {
				t.Errorf("BacklogOf = %+v, want %+v", got, tt.want)
			}
			if got.Paused() != (tt.want.Losses >= scoring.BacklogStop) || got.Doubt() != (tt.want.Losses > 0) {
				t.Errorf("paused %v, doubt %v for %d losses", got.Paused(), got.Doubt(), got.Losses)
			}
		})
	}
	// MinOutcomes re-admitted wins in a row clear the backlog: held tasks
	// come back as fast as the sweeper wakes them.
	var all []scoring.Outcome
	for i := range scoring.DefaultMinOutcomes {
		all = append(all, readmitted(fmt.Sprintf("h%d", i), i, "S", false)...)
	}
	s := scoring.Stats{Outcomes: all}
	if !p.BacklogOf(s).Cleared(scoring.DefaultMinOutcomes) || p.ReadmitLimited(p.BacklogOf(s), false) {
		t.Errorf("%d re-admitted wins: %+v, still limited", scoring.DefaultMinOutcomes, p.BacklogOf(s))
	}
	if !p.ReadmitLimited(p.BacklogOf(s), true) {
		t.Error("on probation: not limited")
	}
	if !p.ReadmitLimited(p.BacklogOf(scoring.Stats{Outcomes: all[1:]}), false) {
		t.Error("one win short: not limited")
	}
}

// A re-admitted held task that fails tells of the held backlog, not of
// the type's new tasks: it neither closes a type a probe re-opened nor
// starts the run of failures that stops a type.
func TestBacklogFailuresLeaveNewTasksAlone(t *testing.T) {
	p := scoring.Policy{}
	var all []scoring.Outcome
	all = append(all, failedTasks(12)...)
	all = append(all, scoring.Outcome{Key: "p:1:outcome", Task: "p", Success: true, Probe: true, End: true, At: t0.Add(time.Hour)})
	all = append(all, readmitted("h1", 3700, "F", true)...)
	all = append(all, readmitted("h2", 3701, "F", true)...)
	if v := p.Evaluate("css_fix", scoring.Stats{Outcomes: all}); !v.Opened || v.Below {
		t.Fatalf("re-admitted failures closed the re-opened type: %+v", v)
	}
	closed := append(append([]scoring.Outcome{}, all...), ladder("n", 3702, "F", true)...)
	if v := p.Evaluate("css_fix", scoring.Stats{Outcomes: closed}); v.Opened || !v.Below {
		t.Fatalf("a new task failed after the probe: still open: %+v", v)
	}

	var healthy []scoring.Outcome
	for i := range 20 {
		healthy = append(healthy, ladder(fmt.Sprintf("ok%d", i), i, "S", false)...)
	}
	healthy = append(healthy, readmitted("h1", 30, "F", true)...)
	healthy = append(healthy, readmitted("h2", 31, "F", true)...)
	healthy = append(healthy, readmitted("h3", 32, "F", true)...)
	if v := p.Evaluate("css_fix", scoring.Stats{Outcomes: healthy}); v.Below {
		t.Fatalf("three re-admitted failures after 20 wins stopped the type: %+v", v)
	}
	stopped := append([]scoring.Outcome{}, healthy...)
	for i := range 3 {
		stopped = append(stopped, ladder(fmt.Sprintf("n%d", i), 33+i, "F", true)...)
	}
	if v := p.Evaluate("css_fix", scoring.Stats{Outcomes: stopped}); !v.Below || v.Run != 3 {
		t.Fatalf("three new tasks failed after 20 wins: %+v, want stopped by the run test", v)
	}
}

// The share of retries explored is the chance that the rung's rate is at
// the floor or above given what was measured, at most 1/RungExplore.
func TestExploreShare(t *testing.T) {
	p := scoring.Policy{}
	for _, tt := range []struct {
		tries, successes int
		want             float64
	}{
		{0, 0, 0.2}, // nothing known: capped
		{5, 0, 0.75 * 0.75 * 0.75 * 0.75 * 0.75 * 0.75}, // Beta(1, 6): 0.75^6
		{20, 0, math.Pow(0.75, 21)},
		{20, 10, 0.2}, // half of them pay: capped
	} {
		if got := p.ExploreShare(tt.tries, tt.successes); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("ExploreShare(%d, %d) = %v, want %v", tt.tries, tt.successes, got, tt.want)
		}
	}
	if got := (scoring.Policy{RungExplore: -1}).ExploreShare(0, 0); got != 0 {
		t.Errorf("RungExplore negative: share %v, want 0", got)
	}
}
