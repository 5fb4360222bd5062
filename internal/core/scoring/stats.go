package scoring

import (
	"math"
	"slices"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Stats is what the store keeps for one task type.
type Stats struct {
	Type string `json:"type"`
	// Outcomes is the window, oldest first, at most Policy.Window entries.
	// It needs no lifetime totals (Prometheus counts outcomes) and keeps no
	// spend (Spending does, exactly): every field here is idempotent under
	// redelivery, because an outcome recorded again after it left a full
	// window sorts before it and is trimmed at once.
	Outcomes []Outcome `json:"outcomes"`
	// BlockStreak counts consecutive gate blocks of this type.
	BlockStreak int `json:"block_streak"`
	// Gates are the recent gate decisions that changed the streak (the last
	// GateMemory), so a redelivered gate call gets the same answer even after
	// other tasks of the type went through the gate.
	Gates []GateMark `json:"gates,omitempty"`
	// Canaries are the tasks admitted while the type had too few settled
	// tasks to score and not ended yet (at most Policy.Canary); cleared
	// once the window holds MinOutcomes settled tasks.
	Canaries []Canary `json:"canaries,omitempty"`
	// Rungs are the retries climbing onto a rung the type has too few
	// retries measured on (Policy.RungCanary), each until its outcome.
	Rungs []Canary `json:"rungs,omitempty"`
	// ProbeAt is when the newest probe was taken from the type's held
	// tasks (Policy.HeldProbe).
	ProbeAt time.Time `json:"probe_at,omitzero"`
	// Fold, when made for Outcomes (NewFold), folds them once for every
	// reader (Folded); nil folds on each use.
	Fold *Fold `json:"-"`
}

// Canary is one admitted task of an unproven type, or one retry measuring
// a rung (Rung set): Key is the task's id, At when it was first admitted.
type Canary struct {
	Key  string      `json:"key"`
	At   time.Time   `json:"at"`
	Rung events.Rung `json:"rung,omitempty"`
	// Pass is the retry's pass holding a place on Rung: its outcome, not
	// one of the task's earlier retries on the rung, frees the place. 0 on
	// places kept before passes were: any retry of the task on the rung
	// frees them.
	Pass int `json:"pass,omitempty"`
}

// Clone returns a copy of s that shares no slice with it.
func (s Stats) Clone() Stats {
	s.Outcomes = slices.Clone(s.Outcomes)
	s.Fold = nil // the copy may be changed in place: it folds on each use
	s.Gates = slices.Clone(s.Gates)
	s.Canaries = slices.Clone(s.Canaries)
	s.Rungs = slices.Clone(s.Rungs)
	return s
}

// Spend is tokens (input + output) and USD.
type Spend struct {
	Tokens int     `json:"tokens"`
	Cost   float64 `json:"cost"`
}

// GateMark is one remembered gate decision.
type GateMark struct {
	Key   string `json:"key"`
	Probe bool   `json:"probe,omitempty"`
}

// GateMemory is how many gate decisions Stats remembers.
const GateMemory = 64

// Counts are the successes and failures in the window.
func (s Stats) Counts() (successes, failures int) {
	for _, o := range s.Outcomes {
		if o.Success {
			successes++
		} else {
			failures++
		}
	}
	return successes, failures
}

// Day is the UTC day of t as spend counters name it ("2006-01-02").
func Day(t time.Time) string { return t.UTC().Format("2006-01-02") }

// Record returns s with outcome o in its place in the window (Insert),
// trimmed to p.Window; once the window holds MinOutcomes outcomes the type
// is scored and its canary places are cleared. When an outcome with o.Key
// is already in the window, or o is older than every outcome of a full
// window, it returns s unchanged and changed=false. s is not modified.
func (p Policy) Record(s Stats, o Outcome) (next Stats, changed bool) {
	p = p.WithDefaults()
	window, changed := Insert(s.Outcomes, o, p.Window)
	if !changed {
		return s, false
	}
	next = s
	next.Outcomes, next.Fold = window, NewFold(window)
	if p.settled(next) >= p.MinOutcomes {
		next.Canaries = nil // scored from now on: the canary phase is over
	}
	return next, true
}

// Gate returns the stats after a gate decision for the task identified by
// key, where below is Evaluate's Verdict.Below:
//
//   - key is a remembered gate key: a redelivery, the stored decision is
//     returned and nothing changes;
//   - not below: the block streak is reset (changed=false when it already
//     was 0, so the hot path needs no write), with no mark remembered;
//   - below, after ProbeAfter consecutive blocks: probe=true, streak reset;
//   - below otherwise: the streak grows by one.
//
// s is not modified.
func (p Policy) Gate(s Stats, key string, below bool) (next Stats, probe, changed bool) {
	p = p.WithDefaults()
	for _, g := range s.Gates {
		if g.Key == key {
			return s, g.Probe, false
		}
	}
	next = s
	switch {
	case !below && s.BlockStreak == 0:
		return s, false, false
	case !below:
		// A reset is remembered by no mark: deciding it again changes
		// nothing that matters, and concurrent gates store their events
		// in an order no replay can know.
		next.BlockStreak = 0
		return next, false, true
	case s.BlockStreak >= p.ProbeAfter:
		next.BlockStreak = 0
		probe = true
	default:
		next.BlockStreak++
	}
	next.Gates = append(slices.Clone(lastN(s.Gates, GateMemory-1)), GateMark{Key: key, Probe: probe})
	return next, probe, true
}

// StreakStep says whether a gate decision steps its type's block streak
// (Policy.Gate), and how: the one rule the gate decides by and rebuild
// replays by. cause is the decision's cause — for the gate, the cause
// before a probe is chosen: CauseTrust for a pass below its threshold —
// probe whether the pass went as a probe, attempt the pass's attempt, and
// heldForTrust whether it is a look at a pass already held for trust.
//
//   - a trusted pass resets it (not below), whatever pass it is;
//   - a look at a held pass is no other step (its hold was): its probe
//     is Policy.HeldProbe's, its stop at the hold time no block;
//   - only new tasks count: a retry stopped or probed is no step;
//   - a new task below its threshold (held, or let through as the probe
//     its streak earned) steps it (below);
//   - any other cause (exempt, reviewed, budget, rung_rate, unproven)
//     leaves it.
func StreakStep(cause events.Cause, probe bool, attempt int, heldForTrust bool) (step, below bool) {
	switch {
	case cause == events.CauseTrusted:
		return true, false
	case heldForTrust, attempt > 1:
		return false, false
	case cause == events.CauseTrust, cause == events.CauseProbe && probe:
		return true, true
	}
	return false, false
}

// AdmitCanary decides whether task key (its id) may go while its type is
// unproven (fewer than MinOutcomes settled tasks): it may when it already
// holds a place (a retry or a redelivery: a canary keeps its place until it
// ends, so its whole ladder is measured), or when fewer than p.Canary
// places are held; places older than p.CanaryTTL are given up first (a
// task lost or stuck). changed reports whether next differs from s. s is
// not modified.
func (p Policy) AdmitCanary(s Stats, key string, now time.Time) (next Stats, admit, changed bool) {
	p = p.WithDefaults()
	if p.Canary < 0 || p.settled(s) >= p.MinOutcomes {
		return s, true, false
	}
	return p.AdmitTrial(s, key, now, p.Canary)
}

// AdmitTrial decides whether task key may go as one of at most places
// tasks on trial (the canary places): when it holds a place already, or
// when fewer than places are held, places older than p.CanaryTTL given up
// first. The gate puts a type's canaries on trial, and the held tasks it
// re-admits while a probe's success alone keeps the type open
// (TrialPlaces). s is not modified.
func (p Policy) AdmitTrial(s Stats, key string, now time.Time, places int) (next Stats, admit, changed bool) {
	p = p.WithDefaults()
	if slices.ContainsFunc(s.Canaries, func(c Canary) bool { return c.Key == key }) {
		return s, true, false
	}
	held := slices.DeleteFunc(slices.Clone(s.Canaries), func(c Canary) bool { return now.Sub(c.At) >= p.CanaryTTL })
	if len(held) >= places {
		if len(held) == len(s.Canaries) {
			return s, false, false
		}
		next = s
		next.Canaries = held
		return next, false, true
	}
	next = s
	next.Canaries = append(held, Canary{Key: key, At: now})
	return next, true, true
}

// TrialPlaces is how many held tasks of the type may be re-admitted at
// once while its held backlog has not Cleared (or a probe's success alone
// keeps the type open, Verdict.Probation): 2, doubling with each
// re-admitted task that succeeded in a row, up to MinOutcomes — a slow
// start, so a lucky probe of a type that still fails, or a backlog held
// through a bad period its new tasks are past, does not send every held
// task before the first of them fails. One place after a re-admitted task
// failed, none once BacklogStop did in a row (Backlog).
func (p Policy) TrialPlaces(s Stats) int {
	p = p.WithDefaults()
	b := p.BacklogOf(s)
	switch {
	case b.Paused():
		return 0
	case b.Doubt():
		return 1
	}
	limit := max(p.MinOutcomes, 2)
	places := 2
	for range min(b.Wins, 16) {
		places = min(2*places, limit)
	}
	return places
}

// ReadmitLimited reports whether the type's held tasks come back only
// through its trial places (TrialPlaces): its held backlog b (BacklogOf)
// has not Cleared. probation is the verdict's: a type a probe alone keeps
// open is limited too.
func (p Policy) ReadmitLimited(b Backlog, probation bool) bool {
	p = p.WithDefaults()
	return probation || !b.Cleared(p.MinOutcomes)
}

// Release returns s without the canary place and the rung places of task
// key; changed is false when key held none. s is not modified.
func Release(s Stats, key string) (next Stats, changed bool) {
	mine := func(c Canary) bool { return c.Key == key }
	if !slices.ContainsFunc(s.Canaries, mine) && !slices.ContainsFunc(s.Rungs, mine) {
		return s, false
	}
	next = s
	next.Canaries = slices.DeleteFunc(slices.Clone(s.Canaries), mine)
	next.Rungs = slices.DeleteFunc(slices.Clone(s.Rungs), mine)
	if len(next.Canaries) == 0 {
		next.Canaries = nil
	}
	if len(next.Rungs) == 0 {
		next.Rungs = nil
	}
	return next, true
}

// ReleaseBefore returns s without the rung places task key holds for
// passes before pass: places of retries that ended with no outcome that
// counts for trust (a refused request, a deployment fault), which nothing
// else frees before the canary TTL, while the task went on. changed is
// false when it held none. s is not modified.
func ReleaseBefore(s Stats, key string, pass int) (next Stats, changed bool) {
	stale := func(c Canary) bool { return c.Key == key && c.Pass > 0 && c.Pass < pass }
	if !slices.ContainsFunc(s.Rungs, stale) {
		return s, false
	}
	next = s
	next.Rungs = slices.DeleteFunc(slices.Clone(s.Rungs), stale)
	if len(next.Rungs) == 0 {
		next.Rungs = nil
	}
	return next, true
}

// Holds reports whether task key holds a canary place or a rung place.
func (s Stats) Holds(key string) bool {
	mine := func(c Canary) bool { return c.Key == key }
	return slices.ContainsFunc(s.Canaries, mine) || slices.ContainsFunc(s.Rungs, mine)
}

// RungRate counts the retries made on rung among the window's outcomes and
// how many of them succeeded.
func (p Policy) RungRate(s Stats, rung events.Rung) (tries, successes int) {
	p = p.WithDefaults()
	for o := range p.windowOutcomes(s) {
		if o.Retry && o.Rung == rung {
			tries++
			if o.Success {
				successes++
			}
		}
	}
	return tries, successes
}

// RungBelow reports whether retries on rung are measured to succeed less
// often than p.RungFloor on the type's own evidence: at least
// p.RungMinSamples of them in the window and successes/tries below the
// floor. RungBelowWith adds the mesh's.
func (p Policy) RungBelow(s Stats, rung events.Rung) (below bool, tries, successes int) {
	p = p.WithDefaults()
	tries, successes = p.RungRate(s, rung)
	if rung == "" || p.RungFloor < 0 || tries < p.RungMinSamples {
		return false, tries, successes
	}
	return float64(successes) < p.RungFloor*float64(tries), tries, successes
}

// RungBelowWith reports whether a retry should not climb onto rung:
// with p.RungMinSamples retries of the type on it in the window or more,
// when their success rate is below p.RungFloor; with fewer, when that rate
// shrunk toward a prior is below the floor. The prior is the type's
// retries on every rung, pulled toward the other types' rate on the rung
// (Pool.Rung, once two types measured the rung, else their retries on any
// rung; itself pulled toward an even chance against the pooled retries
// behind it), each level worth RungMinSamples/2 retries: a type whose
// retries fail on two rungs is not presumed to succeed on a third. Its retries
// count there once they were made on two rungs or more: failures on
// REFINE alone are what PIVOT is for. With fewer than
// two types pooled, the type's own retries on every rung stand in once
// there are RungMinSamples of them (pulled toward an even chance); fewer,
// and the ladder applies as it is: max_retries is what a task may take
// while nothing is known. When
// explore is set (the retry's own rung), a share of the retries the
// estimate stops climb anyway (a hash of explore picks them), so the rung
// keeps being measured — a floor on pooled evidence alone would otherwise
// lock itself shut: the chance that the rung's rate is at the floor or
// above given every retry measured on it (ExploreShare), at most one in
// RungExplore, and at most the same chance read from the type's own
// retries on every rung. Thin evidence explores often, a rung that failed
// dozens of times across the mesh almost never, and so does a type whose
// every retry failed, however well the rung pays for the others: what is
// explored is this type's rung. A rung that stops being climbed gets
// no new samples, so its old ones leave the window as the type's other
// outcomes come in, and the rung is measured again.
func (p Policy) RungBelowWith(s Stats, rung events.Rung, pool *Pool, explore string) (below bool, tries, successes int) {
	p = p.WithDefaults()
	tries, successes = p.RungRate(s, rung)
	switch {
	case rung == "" || p.RungFloor < 0:
		return false, tries, successes
	case tries >= p.RungMinSamples:
		return float64(successes) < p.RungFloor*float64(tries), tries, successes
	}
	k := float64(p.RungMinSamples) / 2
	allTries, allSuccesses, twoRungs := p.retries(s)
	mean, types := pool.Rung(s.Type, rung)
	if types < 2 && allTries < p.RungMinSamples {
		return false, tries, successes // nothing to judge by: the ladder applies as it is
	}
	pooled, pooledOK := pool.RungCounts(s.Type, rung)
	if types < 2 {
		mean = 0.5
	} else {
		// The other types' mean counts as much as the retries behind it:
		// pulled toward an even chance by a prior worth RungMinSamples/2
		// retries, so a few other types' first retries on the rung (a
		// burst, each type's one retry) do not shut it on this type.
		mean = (float64(pooled)*mean + k*0.5) / (float64(pooled) + k)
		if !twoRungs {
			// Retries failing on one rung say little of the others: PIVOT
			// is there for the tasks REFINE does not fix.
			allTries, allSuccesses = 0, 0
		}
	}
	mean = (k*mean + float64(allSuccesses)) / (k + float64(allTries))
	est := (k*mean + float64(successes)) / (k + float64(tries))
	if est >= p.RungFloor {
		return false, tries, successes
	}
	if explore != "" && p.RungExplore > 0 {
		share := p.ExploreShare(allTries+pooled, allSuccesses+pooledOK)
		if twoRungs {
			share = min(share, p.ExploreShare(allTries, allSuccesses))
		}
		if explores(explore, share) {
			return false, tries, successes
		}
	}
	return true, tries, successes
}

// ExploreShare is the share of retries that climb a rung the estimate
// stops (RungBelowWith), given tries retries measured on it of which
// successes succeeded: the chance that its success rate is RungFloor or
// more under a uniform prior (a Beta(1 + successes, 1 + failures)
// posterior), at most 1/RungExplore; 0 when RungExplore is negative.
func (p Policy) ExploreShare(tries, successes int) float64 {
	p = p.WithDefaults()
	if p.RungExplore <= 0 {
		return 0
	}
	limit := 1 / float64(p.RungExplore)
	if p.RungFloor <= 0 {
		return limit
	}
	return min(limit, betaAbove(1+successes, 1+max(tries-successes, 0), p.RungFloor))
}

// betaAbove is P(X >= x) for X ~ Beta(a, b), a and b whole: the chance
// that a Binomial(a+b-1, x) is at most a-1.
func betaAbove(a, b int, x float64) float64 {
	if x >= 1 {
		return 0
	}
	n := a + b - 1
	lx, l1x := math.Log(x), math.Log1p(-x)
	lgn, _ := math.Lgamma(float64(n + 1))
	sum := 0.0
	for i := range a {
		lgi, _ := math.Lgamma(float64(i + 1))
		lgr, _ := math.Lgamma(float64(n - i + 1))
		sum += math.Exp(lgn - lgi - lgr + float64(i)*lx + float64(n-i)*l1x)
	}
	return min(sum, 1)
}

// retries counts the retries on every rung among the window's outcomes,
// how many of them succeeded and whether they were made on two rungs or
// more.
func (p Policy) retries(s Stats) (tries, successes int, twoRungs bool) {
	var first events.Rung
	for o := range p.windowOutcomes(s) {
		if o.Retry && o.Rung != "" {
			tries++
			if o.Success {
				successes++
			}
			if first == "" {
				first = o.Rung
			} else if o.Rung != first {
				twoRungs = true
			}
		}
	}
	return tries, successes, twoRungs
}

// settled counts the tasks of the window whose result is final.
func (p Policy) settled(s Stats) int {
	return len(p.tasksOf(s, true))
}

// HeldProbe decides whether a held task of the type goes through as a
// probe now: when the probe interval has passed — doubled for every probe
// that failed in a row, up to MaxProbeInterval — since the type's last
// probe and its newest failed task (a type that has just failed is not
// probed at once); the probe then takes the type's probe time. A backlog
// of held tasks thus sends one probe per interval, not one per look. The
// same pace re-admits a paused held backlog (Backlog.Paused) of a type
// whose new tasks succeed, the interval doubling too for every
// re-admitted task that failed past BacklogStop. s is not modified.
func (p Policy) HeldProbe(s Stats, now time.Time) (next Stats, probe bool) {
	p = p.WithDefaults()
	rs := p.tasksOf(s, false)
	wait := p.ProbeInterval
	for range min(failedProbes(rs)+max(0, backlogOf(rs).Losses-BacklogStop), 16) {
		wait = min(2*wait, MaxProbeInterval)
	}
	since := s.ProbeAt
	for i := len(rs) - 1; i >= 0; i-- {
		if !rs[i].Success {
			if rs[i].At.After(since) {
				since = rs[i].At
			}
			break
		}
	}
	if !since.IsZero() && now.Sub(since) < wait {
		return s, false
	}
	next = s
	next.ProbeAt = now
	return next, true
}

func outcomeAfter(a, b Outcome) bool {
	if !a.At.Equal(b.At) {
		return a.At.After(b.At)
	}
	return a.Key > b.Key
}
