package scoring

import (
	"hash/fnv"
	"iter"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// TaskResult is one task as its type's trust sees it: the attempts of the
// task among the outcomes, folded into one result. A task weighs one in a
// type's score however many attempts it took: a hard task climbing its
// ladder is one failure of its type, not seven.
type TaskResult struct {
	Task string
	// Success: the task succeeded (an attempt that succeeded and ended it).
	Success bool
	// Ended: it succeeded, or its ladder ended without success (the
	// recorder's handoff, a pipeline's failure, the gate's handoff).
	Ended bool
	// Probe: it went through the gate as an exploration probe.
	Probe bool
	// Held: the gate held it for its type's trust before letting it
	// through (Outcome.Held): one of the type's held backlog.
	Held bool
	// Failures counts its failed attempts.
	Failures int
	// At is when its newest outcome was recorded: tasks are ordered by it,
	// so a task that has just ended weighs as the newest.
	At time.Time
}

// Settled reports whether the task's result is final: it succeeded or it
// ended. A task still climbing its ladder has failed so far, but may yet
// succeed.
func (r TaskResult) Settled() bool { return r.Success || r.Ended }

// TaskID is the task an outcome belongs to: Task, or for an outcome
// recorded before outcomes named their task, the id in its key
// ("<id>:<pass>:outcome").
func (o Outcome) TaskID() string {
	if o.Task != "" {
		return o.Task
	}
	if i := strings.Index(o.Key, ":"); i > 0 {
		return o.Key[:i]
	}
	return o.Key
}

// Tasks folds outcomes (in window order: Insert's, by time) into one
// result per task, ordered by each task's newest outcome, oldest first.
func Tasks(outcomes []Outcome) []TaskResult {
	rs, _ := fold(outcomes)
	return rs
}

// fold is Tasks, with the index in rs of each outcome's task.
func fold(outcomes []Outcome) (rs []TaskResult, of []int32) {
	idx := make(map[string]int32, len(outcomes))
	rs = make([]TaskResult, 0, len(outcomes))
	of = make([]int32, len(outcomes))
	last := make([]int, 0, len(outcomes)) // by result: its newest outcome's index
	for n, o := range outcomes {
		id := o.TaskID()
		i, ok := idx[id]
		if !ok {
			i = int32(len(rs))
			idx[id] = i
			rs = append(rs, TaskResult{Task: id})
			last = append(last, n)
		}
		of[n] = i
		r := &rs[i]
		if !o.At.Before(r.At) {
			r.At = o.At
		}
		last[i] = n
		if o.Marker {
			r.Ended = true
			continue
		}
		// A success ends the task only when it says so (End): a pipeline
		// step that passed is no success of its task. An outcome without
		// a task (recorded before outcomes named theirs) is a task of its
		// own, ended.
		legacy := o.Task == ""
		r.Success = r.Success || (o.Success && (o.End || legacy))
		r.Ended = r.Ended || o.End || legacy || r.Success
		r.Probe = r.Probe || o.Probe
		r.Held = r.Held || o.Held
		if !o.Success {
			r.Failures++
		}
	}
	if slices.IsSorted(last) { // as usual: each task's outcomes are together
		return slices.Clip(rs), of
	}
	order := make([]int32, len(rs))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int { return last[a] - last[b] })
	sorted := make([]TaskResult, len(rs))
	moved := make([]int32, len(rs)) // by old index: the new one
	for i, j := range order {
		sorted[i], moved[j] = rs[j], int32(i)
	}
	for n, i := range of {
		of[n] = moved[i]
	}
	return sorted, of
}

// Fold is the fold of one outcome slice (Tasks), made on first use and
// shared by everyone who reads that slice. A View hands the same window
// to the gate's score, its canary count, its rung rates and the mesh-wide
// pool many times between two outcomes of the type; folding it afresh each
// time was a fifth of the mesh's allocations. A Fold answers only for the
// slice it was made for (the same first element and length), whose
// elements must not change: Stats whose Outcomes were replaced or appended
// to fold them afresh.
type Fold struct {
	outcomes []Outcome
	once     sync.Once
	rs       []TaskResult
	of       []int32
}

// NewFold returns the Fold of outcomes, not yet folded.
func NewFold(outcomes []Outcome) *Fold { return &Fold{outcomes: outcomes} }

// get is the fold of outcomes when f was made for them.
func (f *Fold) get(outcomes []Outcome) (rs []TaskResult, of []int32, ok bool) {
	if f == nil || len(outcomes) != len(f.outcomes) || len(outcomes) > 0 && &outcomes[0] != &f.outcomes[0] {
		return nil, nil, false
	}
	f.once.Do(func() { f.rs, f.of = fold(f.outcomes) })
	return f.rs, f.of, true
}

// Folded is Tasks(s.Outcomes), from s.Fold when it was made for them. The
// results are shared and must not be modified.
func (s Stats) Folded() []TaskResult {
	rs, _ := s.folded()
	return rs
}

func (s Stats) folded() ([]TaskResult, []int32) {
	if rs, of, ok := s.Fold.get(s.Outcomes); ok {
		return rs, of
	}
	return fold(s.Outcomes)
}

// tasks is the newest p.Window tasks of outcomes; settled keeps only
// those whose result is final.
func (p Policy) tasks(outcomes []Outcome, settled bool) []TaskResult {
	return p.window(Tasks(outcomes), settled)
}

// tasksOf is p.tasks of s's outcomes, folded once (Stats.Folded).
func (p Policy) tasksOf(s Stats, settled bool) []TaskResult {
	return p.window(s.Folded(), settled)
}

// window is the newest p.Window of the folded tasks rs; settled keeps only
// those whose result is final. rs is not modified.
func (p Policy) window(rs []TaskResult, settled bool) []TaskResult {
	if settled {
		rs = slices.DeleteFunc(slices.Clone(rs), func(r TaskResult) bool { return !r.Settled() })
	}
	return lastN(rs, p.Window)
}

// scoreTasks is the SPEC §4 score over task results, oldest first: a task
// that succeeded counts 1, any other 0.
func scoreTasks(rs []TaskResult, p Policy) (score, overall, recency float64) {
	if len(rs) == 0 {
		return 0, 0, 0
	}
	var successes, weighted, total float64
	w := 1.0
	for i := len(rs) - 1; i >= 0; i-- {
		if rs[i].Success {
			successes++
			weighted += w
		}
		total += w
		w *= p.Decay
	}
	overall = successes / float64(len(rs))
	recency = weighted / total
	return p.OverallWeight*overall + p.RecencyWeight*recency, overall, recency
}

// openedByProbe reports whether a probe's success has re-opened the type:
// the newest probe among the settled tasks succeeded and no new task
// settled since has failed. A run of wins after a probe keeps the type
// open while its score climbs back; the first failure of a new task
// closes it again. A re-admitted held task that fails does not: it tells
// of the held backlog (BacklogOf), whose oldest tasks may have been held
// through a bad period that is over for the new ones.
func openedByProbe(rs []TaskResult) bool {
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		switch {
		case !r.Settled(), r.backlog():
		case !r.Success:
			return false
		case r.Probe:
			return true
		}
	}
	return false
}

// failedRun tests whether the type has just changed for the worse: its
// newest settled tasks all failed, k of them, where a run that long would
// happen less than alpha of the time at the success rate of the settled
// tasks before it (Laplace-smoothed: (successes+1)/(tasks+2)). With the
// default alpha a type that always succeeded is stopped after two failed
// tasks in a row, one that succeeds half the time after ten: a regression
// shows in a few tasks
// instead of the dozens the window's score needs, and a type whose tasks
// sometimes fail is not stopped for a streak its rate explains.
//
// A type needs a known rate to change from: minBefore settled tasks
// before the run, or the prior, whose weight counts as that many tasks of
// the other types' mean rate ((successes + weight·mean + 1) / (tasks +
// weight + 2)). So a new type unlike the others shows too: in a mesh whose
// types nearly all succeed (weight 10) its first 3–4 settled tasks failing
// stop it; where types differ (weight 0.5) it takes about ten. pooled
// reports that the prior counted.
func failedRun(rs []TaskResult, alpha float64, minBefore int, prior Prior) (k int, stopped, pooled bool) {
	// Newest first, over the settled tasks but the held backlog's (whose
	// failures are its own: BacklogOf): the run, then the tasks before it.
	inRun, before, wins := true, 0, 0
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		switch {
		case !r.Settled() || r.backlog():
		case inRun && !r.Success:
			k++
		default:
			inRun = false
			before++
			if r.Success {
				wins++
			}
		}
	}
	if k == 0 || alpha <= 0 {
		return k, false, false
	}
	seen, won := float64(before), float64(wins)
	if before < max(minBefore, 1) {
		if !prior.Known() {
			return k, false, false
		}
		seen, won, pooled = seen+prior.Weight, won+prior.Weight*prior.Mean, true
	}
	fail := 1 - (won+1)/(seen+2)
	return k, math.Pow(fail, float64(k)) < alpha, pooled
}

// backlog reports whether r is a re-admitted held task that did not go
// as a probe: it measures the held backlog, not the type's new tasks.
func (r TaskResult) backlog() bool { return r.Held && !r.Probe }

// Backlog is what the type's re-admitted held tasks say of the tasks it
// still holds. When the oldest held tasks fail again after the type
// recovered, they were likely held through a bad period that is over for
// new tasks but not for them: re-admitting the rest in bulk would pay a
// call for each. So the gate re-admits them a few at a time — 2, doubling
// with each that succeeds, at most MinOutcomes (Policy.TrialPlaces) —
// until MinOutcomes succeeded in a row (Cleared), one at a time after one
// failed, and after BacklogStop failed in a row only at the held-probe
// pace (Policy.HeldProbe), handing off the retries of the next once
// BacklogStop ended failed; the newest held tasks — the most like the new
// tasks that succeed — go first once one failed. Probes a type below its
// threshold takes from its held tasks judge the type, not the backlog:
// they are left out. The record is the type's window's (its newest
// Window outcomes): a backlog paused by failures long past is tried again
// once they left the window.
type Backlog struct {
	// Losses is how many re-admitted tasks failed since the newest one
	// that succeeded — a task still climbing its ladder that failed so
	// far counts — and Ended how many of those ended; Wins how many
	// succeeded since the newest that failed; Failed whether any in the
	// window failed.
	Losses, Ended, Wins int
	Failed              bool
}

// Cleared reports whether the held backlog has shown, by minOutcomes
// re-admitted tasks succeeding in a row, that the rest may come back as
// fast as the gate's sweeper wakes them.
func (b Backlog) Cleared(minOutcomes int) bool { return b.Wins >= max(minOutcomes, 1) }

// BacklogStop is how many re-admitted held tasks failing in a row pause
// the re-admission of the type's held backlog: the rest goes only at the
// held-probe pace; once as many ended failed, the retries of the next
// re-admitted are handed off.
const BacklogStop = 2

// Paused reports whether the held backlog is re-admitted only at the
// held-probe pace.
func (b Backlog) Paused() bool { return b.Losses >= BacklogStop }

// Doubt reports whether the newest re-admitted held task failed: the
// backlog is re-admitted one at a time at most.
func (b Backlog) Doubt() bool { return b.Losses > 0 }

// HandsOff reports whether a re-admitted task's retry is handed off:
// BacklogStop of the re-admitted tasks before it ended failed in a row. A
// retry is not stopped by its siblings' first failures while they still
// climb (a type whose tasks need a retry), as EvaluateWith judges retries.
func (b Backlog) HandsOff() bool { return b.Ended >= BacklogStop }

// NewestFirst reports whether the held backlog is re-admitted newest
// first: a re-admitted task failed in the window.
func (b Backlog) NewestFirst() bool { return b.Failed }

// BacklogOf is the held backlog's record among the window's tasks of s.
func (p Policy) BacklogOf(s Stats) Backlog {
	p = p.WithDefaults()
	return backlogOf(p.tasksOf(s, false))
}

// backlogOf is BacklogOf over the window's folded tasks rs.
func backlogOf(rs []TaskResult) Backlog {
	var b Backlog
	counting := true
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		switch {
		case !r.backlog():
			continue
		case r.Success:
			if counting && b.Losses == 0 {
				b.Wins++
			} else {
				counting = false
			}
		case r.Failures == 0 && !r.Ended:
			// A pipeline whose steps so far passed: nothing failed yet.
		default:
			b.Failed = true
			if counting && b.Wins == 0 {
				b.Losses++
				if r.Ended {
					b.Ended++
				}
			} else {
				counting = false
			}
		}
	}
	return b
}

// failedProbes counts the probes that failed since the newest probe that
// succeeded: each one doubles the time before the next probe of held tasks.
func failedProbes(rs []TaskResult) int {
	n := 0
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i]
		if !r.Probe || !r.Settled() {
			continue
		}
		if r.Success {
			break
		}
		n++
	}
	return n
}

// Prior is what the mesh knows of task types before it knows a given one:
// the mean task success rate of the other types and how many tasks of a
// type's own that knowledge is worth (Weight). Types differ little → a
// large weight: a new type is presumed to be like the others until it
// shows otherwise; types that are either healthy or hopeless → a small
// one: a new type is judged on its own first tasks. The zero Prior knows
// nothing.
type Prior struct {
	Mean   float64
	Weight float64
	// Types is how many types it was learned from.
	Types int
}

// Known reports whether the prior says anything.
func (pr Prior) Known() bool { return pr.Types > 0 && pr.Weight > 0 }

// Shrink is the type's own rate own, over n tasks, pulled toward the
// prior in proportion to how little the type has seen (a beta-binomial
// posterior mean).
func (pr Prior) Shrink(own float64, n int) float64 {
	if !pr.Known() {
		return own
	}
	return (pr.Weight*pr.Mean + float64(n)*own) / (pr.Weight + float64(n))
}

// Prior bounds: a prior never counts for more than MaxPriorWeight tasks of
// a type's own, nor for less than MinPriorWeight; it is learned once
// PoolMinTypes types have PoolMinTasks settled tasks each.
const (
	MinPriorWeight = 0.5
	MaxPriorWeight = 10
	PoolMinTypes   = 3
	PoolMinTasks   = 3
)

// Pool is the mesh-wide evidence every type's estimate is shrunk toward:
// each type's settled task success rate and each rung's retry success
// rate, per type, so that a type with many tasks counts once, like any
// other. It is computed from every type's Stats (View.All).
type Pool struct {
	tasks map[string]float64              // by type: settled task success rate
	rungs map[events.Rung]map[string]rate // by rung, by type: retry successes
}

type rate struct{ tries, successes int }

// NewPool measures all under p (each type's window as p scores it).
func NewPool(all []Stats, p Policy) *Pool {
	p = p.WithDefaults()
	pool := &Pool{tasks: map[string]float64{}, rungs: map[events.Rung]map[string]rate{}}
	for _, s := range all {
		rs := p.tasksOf(s, true)
		if len(rs) >= PoolMinTasks {
			ok := 0
			for _, r := range rs {
				if r.Success {
					ok++
				}
			}
			pool.tasks[s.Type] = float64(ok) / float64(len(rs))
		}
		for o := range p.windowOutcomes(s) {
			if !o.Retry || o.Rung == "" {
				continue
			}
			m := pool.rungs[o.Rung]
			if m == nil {
				m = map[string]rate{}
				pool.rungs[o.Rung] = m
			}
			r := m[s.Type]
			r.tries++
			if o.Success {
				r.successes++
			}
			m[s.Type] = r
		}
	}
	return pool
}

// Prior is the prior of taskType: the other types' task success rates'
// mean, weighted by how alike they are (a method-of-moments beta fit:
// weight = mean × (1 − mean) / variance − 1, within [MinPriorWeight,
// MaxPriorWeight]). A nil Pool, or one with fewer than PoolMinTypes other
// types, knows nothing.
func (pool *Pool) Prior(taskType string) Prior {
	if pool == nil {
		return Prior{}
	}
	var n, sum, sq float64
	for t, r := range pool.tasks {
		if t == taskType {
			continue
		}
		n++
		sum += r
		sq += r * r
	}
	if n < PoolMinTypes {
		return Prior{}
	}
	mean := sum / n
	variance := max(sq/n-mean*mean, 0)
	weight := float64(MaxPriorWeight)
	if variance > 0 {
		weight = min(max(mean*(1-mean)/variance-1, MinPriorWeight), MaxPriorWeight)
	}
	return Prior{Mean: mean, Weight: weight, Types: int(n)}
}

// Rung is the other types' retry success rate on rung — the mean of their
// rates, each type counting once — and how many types measured it. A rung
// fewer than two other types measured takes their retries on every rung
// instead: how often a retry pays in this mesh at all.
func (pool *Pool) Rung(taskType string, rung events.Rung) (mean float64, types int) {
	if pool == nil {
		return 0, 0
	}
	if mean, types = pool.rate(taskType, func(r events.Rung) bool { return r == rung }); types >= 2 {
		return mean, types
	}
	return pool.rate(taskType, func(events.Rung) bool { return true })
}

// RungCounts is every retry the other types measured on rung and how many
// succeeded — on any rung when fewer than two types measured this one, as
// Rung reads them: the evidence of how often the rung pays in this mesh.
func (pool *Pool) RungCounts(taskType string, rung events.Rung) (tries, successes int) {
	if pool == nil {
		return 0, 0
	}
	on := func(r events.Rung) bool { return r == rung }
	if _, types := pool.rate(taskType, on); types < 2 {
		on = func(events.Rung) bool { return true }
	}
	for r, m := range pool.rungs {
		if !on(r) {
			continue
		}
		for t, c := range m {
			if t != taskType {
				tries += c.tries
				successes += c.successes
			}
		}
	}
	return tries, successes
}

func (pool *Pool) rate(taskType string, rungs func(events.Rung) bool) (mean float64, types int) {
	by := map[string]rate{}
	for rung, m := range pool.rungs {
		if !rungs(rung) {
			continue
		}
		for t, r := range m {
			if t == taskType {
				continue
			}
			sum := by[t]
			sum.tries += r.tries
			sum.successes += r.successes
			by[t] = sum
		}
	}
	var total float64
	for _, r := range by {
		if r.tries > 0 {
			total += float64(r.successes) / float64(r.tries)
			types++
		}
	}
	if types == 0 {
		return 0, 0
	}
	return total / float64(types), types
}

// windowOutcomes is the outcomes of s of the newest p.Window tasks, in
// order.
func (p Policy) windowOutcomes(s Stats) iter.Seq[Outcome] {
	rs, of := s.folded()
	cut := int32(len(rs) - p.Window)
	return func(yield func(Outcome) bool) {
		for n, o := range s.Outcomes {
			if of[n] >= cut && !yield(o) {
				return
			}
		}
	}
}

// explores reports whether the retry named key is among the share of
// retries that climb a rung only the estimate advises against, so that
// the rung keeps being measured (a rung nobody climbs is never measured
// again): a hash of key, read as a number in [0, 1), below share.
func explores(key string, share float64) bool {
	if share <= 0 {
		return false
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return float64(h.Sum32())/(1<<32) < share
}

// Sample is how many settled tasks of a type's own, all failed, take its
// shrunk score below threshold: the canaries a new type needs at once to
// be decided in one round. 0 when the prior knows nothing.
func (pr Prior) Sample(threshold float64) int {
	if !pr.Known() || threshold <= 0 {
		return 0
	}
	return int(math.Floor(pr.Weight*max(pr.Mean-threshold, 0)/threshold)) + 1
}
