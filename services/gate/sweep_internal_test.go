package gate

import (
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// A pass woken again and again is woken less and less often: 5s, 10s,
// 20s … up to MaxRewake.
func TestRewakeBacksOff(t *testing.T) {
	at := time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		n     int
		after time.Duration
	}{{1, Rewake}, {2, 2 * Rewake}, {3, 4 * Rewake}, {7, MaxRewake}, {40, MaxRewake}} {
		w := woken{at: at, n: tt.n}
		if w.due(at.Add(tt.after-time.Millisecond), false) {
			t.Errorf("woken %d times: due again before %s", tt.n, tt.after)
		}
		if !w.due(at.Add(tt.after), false) {
			t.Errorf("woken %d times: not due again after %s", tt.n, tt.after)
		}
	}
}

// A pass woken for a canary place, whose look found every place taken,
// waits out Rewake while its type sends canaries, and is due at once when
// the canaries have scored the type: the bulk wake does not wait for it.
// Its wakes have Msg-Ids of their own, so the stream keeps both.
func TestAPlaceWakeDoesNotDelayTheBulkWake(t *testing.T) {
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	placed := woken{at: at, n: 1, place: true}
	if placed.due(at.Add(time.Second), true) {
		t.Error("woken for a place: due again within Rewake while the type sends canaries")
	}
	if !placed.due(at.Add(time.Second), false) {
		t.Error("woken for a place: not due at once when the canaries scored the type")
	}
	if (woken{at: at, n: 1}).due(at.Add(time.Second), false) {
		t.Error("a bulk wake: due again within Rewake")
	}

	e := services.HeldEntry{Task: "t1", Type: "fresh", Pass: 1, Hold: events.HoldCanary}
	if wakeID(wake{entry: e, place: true}, at) == wakeID(wake{entry: e}, at) {
		t.Error("a place wake and a bulk wake of one period share a Msg-Id: the stream keeps one")
	}
	if wakeID(wake{entry: e}, at) != wakeID(wake{entry: e}, at.Add(time.Second)) {
		t.Error("two bulk wakes of one period have different Msg-Ids: two sweepers would both wake")
	}
}

// A retry woken to climb a rung is due again at once, not after Rewake,
// when it waits for another rung now, its rung has been measured since
// (RungThin: a retry on it succeeded, or enough failed to judge it), or a
// retry on it has an outcome since (the place it found taken may be free).
func TestARungWaitIsDueWhenItsRungMoves(t *testing.T) {
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	p := trust.Policy{}.WithDefaults()
	w := woken{at: at, n: 1, rung: events.RungRefine}
	waits := func(r events.Rung) services.HeldEntry {
		return services.HeldEntry{Hold: events.HoldRung, Rung: r}
	}
	if (&judgement{scoring: p}).rungMoved(waits(events.RungRefine), w) {
		t.Error("a retry still waiting for the same unmeasured rung: due again within Rewake")
	}
	if !(&judgement{scoring: p}).rungMoved(waits(events.RungPivot), w) {
		t.Error("a retry now waiting for another rung: not due again at once")
	}
	measured := trust.Stats{Outcomes: []trust.Outcome{{Key: "t0:2:outcome", Task: "t0", Rung: events.RungRefine, Retry: true, Success: true, At: at}}}
	failed := trust.Stats{Outcomes: []trust.Outcome{{Key: "t0:2:outcome", Task: "t0", Rung: events.RungRefine, Retry: true, At: at}}}
	if !(&judgement{scoring: p, stats: failed}).rungMoved(waits(events.RungRefine), w) {
		t.Error("a retry on its rung has an outcome since its wake (a place may be free): not due again at once")
	}
	seenFail := woken{at: at, n: 1, rung: events.RungRefine, tries: 1}
	if (&judgement{scoring: p, stats: failed}).rungMoved(waits(events.RungRefine), seenFail) {
		t.Error("woken after its rung's only retry failed (still thin), nothing since: due again within Rewake")
	}
	if !(&judgement{scoring: p, stats: measured}).rungMoved(waits(events.RungRefine), w) {
		t.Error("a retry whose rung was measured: not due again at once")
	}
	// Woken once its rung was measured, it is not woken again every sweep
	// while its look is under way; that wake has a Msg-Id of its own, so a
	// place wake earlier in the period does not stand for it.
	again := woken{at: at, n: 1, rung: events.RungRefine, measured: true, tries: 1}
	if (&judgement{scoring: p, stats: measured}).rungMoved(waits(events.RungRefine), again) {
		t.Error("woken for its measured rung: due again before Rewake")
	}
	e := waits(events.RungRefine)
	e.Task, e.Pass = "t1", 2
	if wakeID(wake{entry: e}, at) == wakeID(wake{entry: e, measured: true}, at) {
		t.Error("a place wake and a measured-rung wake of one period share a Msg-Id: the stream keeps one")
	}
	if wakeID(wake{entry: e, tries: 1}, at) == wakeID(wake{entry: e, tries: 2}, at) {
		t.Error("wakes after two outcomes on the rung, in one period, share a Msg-Id: the stream keeps one")
	}
}

// A sweep's judgement of one type wakes, of the passes waiting for its
// canaries, as many as there are free places, each that waited the canary
// TTL, and all once the type is scored; of the retries waiting for a rung,
// as many as the rung has free places, each that waited the canary TTL,
// and all once the rung is measured; of the passes held for trust, the
// readmits while it is open, the expired, and one probe when due.
func TestJudgementDue(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	p := trust.Policy{}.WithDefaults()
	canary := func(age time.Duration) services.HeldEntry {
		return services.HeldEntry{Since: now.Add(-age), Hold: events.HoldCanary}
	}
	held := func(age time.Duration) services.HeldEntry { return services.HeldEntry{Since: now.Add(-age)} }
	queued := func(age time.Duration) services.HeldEntry {
		return services.HeldEntry{Since: now.Add(-age), Hold: events.HoldQueued}
	}
	unproven := trust.Verdict{Unproven: true}
	below := trust.Verdict{Below: true}
	rung := func(r events.Rung, age time.Duration) services.HeldEntry {
		return services.HeldEntry{Since: now.Add(-age), Hold: events.HoldRung, Rung: r, Retry: true}
	}
	refineTaken := trust.Stats{Rungs: []trust.Canary{{Key: "t0", Rung: events.RungRefine, At: now.Add(-time.Second)}}}
	refineFailed := trust.Stats{Outcomes: []trust.Outcome{{Key: "t0:2:outcome", Task: "t0", Rung: events.RungRefine, Retry: true, At: now}}}
	refineMeasured := trust.Stats{Outcomes: []trust.Outcome{{Key: "t0:2:outcome", Task: "t0", Rung: events.RungRefine, Retry: true, Success: true, At: now}}}
	tests := []struct {
		name    string
		j       judgement
		entries []services.HeldEntry
		want    []string
	}{
		{"no free place: the canary waits sleep on", judgement{first: unproven},
			[]services.HeldEntry{canary(time.Minute), canary(time.Second)}, []string{"", ""}},
		{"one free place: the oldest wakes", judgement{first: unproven, places: 1},
			[]services.HeldEntry{canary(time.Minute), canary(time.Second)}, []string{WakeCanary, ""}},
		{"past the canary TTL: it wakes to go anyway", judgement{first: unproven},
			[]services.HeldEntry{canary(p.CanaryTTL), canary(time.Second)}, []string{WakeCanary, ""}},
		{"scored: every canary wait wakes", judgement{first: trust.Verdict{}},
			[]services.HeldEntry{canary(time.Minute), canary(time.Second)}, []string{WakeCanary, WakeCanary}},
		{"scored below: every canary wait wakes, to be held for trust", judgement{first: below},
			[]services.HeldEntry{canary(time.Minute)}, []string{WakeCanary}},
		{"exempt: every canary wait wakes", judgement{first: unproven, exempt: true},
			[]services.HeldEntry{canary(time.Minute)}, []string{WakeCanary}},
		{"recovered: readmits, oldest first", judgement{first: trust.Verdict{}, readmits: 1},
			[]services.HeldEntry{held(time.Hour), held(time.Minute)}, []string{WakeReadmit, ""}},
		{"below: the expired and one probe", judgement{first: below, probe: true},
			[]services.HeldEntry{held(p.HoldTime), held(time.Hour), held(time.Minute)}, []string{WakeExpired, WakeProbe, ""}},
		{"a retry is judged on settled tasks", judgement{first: trust.Verdict{}, retry: below, readmits: 1},
			[]services.HeldEntry{{Since: now.Add(-time.Hour), Retry: true}}, []string{""}},
		{"the executor's backlog full: no bulk wake", judgement{first: trust.Verdict{}, readmits: 1, room: ptr(0)},
			[]services.HeldEntry{canary(time.Minute), held(time.Hour)}, []string{"", ""}},
		{"the executor's backlog full: a free canary place still wakes", judgement{first: unproven, places: 1, room: ptr(0)},
			[]services.HeldEntry{canary(p.CanaryTTL), canary(time.Minute)}, []string{WakeCanary, ""}},
		{"the executor's backlog full: a probe and a hand-off still wake", judgement{first: below, probe: true, room: ptr(0)},
			[]services.HeldEntry{held(p.HoldTime), held(time.Hour)}, []string{WakeExpired, WakeProbe}},
		{"room for one: the oldest", judgement{first: trust.Verdict{}, readmits: 5, room: ptr(1)},
			[]services.HeldEntry{canary(time.Minute), canary(time.Second)}, []string{WakeCanary, ""}},
		{"recovered, its held backlog paused: the expired and one probe, no readmit", judgement{first: trust.Verdict{}, readmits: 5, probe: true, backlog: trust.Backlog{Losses: trust.BacklogStop}},
			[]services.HeldEntry{held(p.HoldTime), held(time.Hour), held(time.Minute)}, []string{WakeExpired, WakeProbe, ""}},
		{"waiting their turn: as many as the lane's quota", judgement{first: trust.Verdict{}, quota: 2},
			[]services.HeldEntry{queued(time.Minute), queued(time.Second), queued(0)}, []string{WakeQueued, WakeQueued, ""}},
		{"waiting their turn, no room: asleep", judgement{first: trust.Verdict{}, quota: 2, room: ptr(0)},
			[]services.HeldEntry{queued(time.Minute)}, []string{""}},
		{"waiting for a rung, its place taken: asleep", judgement{stats: refineTaken},
			[]services.HeldEntry{rung(events.RungRefine, time.Minute), rung(events.RungRefine, time.Second)}, []string{"", ""}},
		{"waiting for a rung, its place free: the oldest wakes", judgement{},
			[]services.HeldEntry{rung(events.RungRefine, time.Minute), rung(events.RungRefine, time.Second)}, []string{WakeRung, ""}},
		{"waiting for two rungs: one wake per free rung", judgement{stats: refineTaken},
			[]services.HeldEntry{rung(events.RungRefine, time.Minute), rung(events.RungPivot, time.Second), rung(events.RungPivot, 0)}, []string{"", WakeRung, ""}},
		{"the rung measured: every wait on it wakes", judgement{stats: refineMeasured},
			[]services.HeldEntry{rung(events.RungRefine, time.Minute), rung(events.RungRefine, time.Second)}, []string{WakeRung, WakeRung}},
		{"the rung's only retry failed: one wait wakes for its free place", judgement{stats: refineFailed},
			[]services.HeldEntry{rung(events.RungRefine, time.Minute), rung(events.RungRefine, time.Second)}, []string{WakeRung, ""}},
		{"the type became exempt: every wait on its rungs wakes (an exempt type's retries never wait)", judgement{stats: refineTaken, exempt: true},
			[]services.HeldEntry{rung(events.RungRefine, time.Minute), rung(events.RungRefine, time.Second)}, []string{WakeRung, WakeRung}},
		{"waited the canary TTL for a rung: it wakes to go anyway", judgement{stats: refineTaken},
			[]services.HeldEntry{rung(events.RungRefine, p.CanaryTTL)}, []string{WakeRung}},
		{"the rung measured, no room: asleep", judgement{stats: refineMeasured, room: ptr(0)},
			[]services.HeldEntry{rung(events.RungRefine, time.Minute)}, []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := tt.j
			j.scoring = p
			if j.room == nil {
				j.room = ptr(1000)
			}
			for i, e := range tt.entries {
				if got := j.due(e, now); got != tt.want[i] {
					t.Fatalf("entry %d: woken for %q, want %q", i, got, tt.want[i])
				}
			}
		})
	}
}

// A lane is quiet — nothing younger can be due — only when nothing is left
// to wake but passes that waited their time.
func TestJudgementQuiet(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	p := trust.Policy{}.WithDefaults()
	young := services.HeldEntry{Since: now.Add(-time.Second), Hold: events.HoldCanary}
	lots := ptr(1000)
	if !(&judgement{scoring: p, first: trust.Verdict{Unproven: true}, room: lots}).quiet(young, now) {
		t.Fatal("no free place and a young canary wait: not quiet")
	}
	if (&judgement{scoring: p, first: trust.Verdict{Unproven: true}, places: 1, room: lots}).quiet(young, now) {
		t.Fatal("a free place: quiet")
	}
	if (&judgement{scoring: p, room: lots}).quiet(young, now) {
		t.Fatal("a scored type: quiet")
	}
	if !(&judgement{scoring: p, room: ptr(0)}).quiet(young, now) {
		t.Fatal("a scored type, the executor's backlog full: not quiet")
	}
	trusty := services.HeldEntry{Since: now.Add(-time.Second)}
	if !(&judgement{scoring: p, first: trust.Verdict{Below: true}, room: lots}).quiet(trusty, now) {
		t.Fatal("below, no probe due, a young hold: not quiet")
	}
	if (&judgement{scoring: p, first: trust.Verdict{Below: true}, probe: true, room: lots}).quiet(trusty, now) {
		t.Fatal("a probe due: quiet")
	}
}

// A sweep is cut short — the sweeper sweeps again soon — only when a pass
// that would go to the model is left asleep for want of room or of its
// lane's share of it: not for a pass held for trust whose type is below
// its threshold, however full the backlog.
func TestJudgementShort(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	p := trust.Policy{}.WithDefaults()
	young := now.Add(-time.Second)
	for _, tt := range []struct {
		name  string
		j     judgement
		e     services.HeldEntry
		short bool
	}{
		{"below, backlog full", judgement{first: trust.Verdict{Below: true}, readmits: 2, room: ptr(0)}, services.HeldEntry{Since: young}, false},
		{"recovered, backlog full", judgement{readmits: 2, room: ptr(0)}, services.HeldEntry{Since: young}, true},
		{"recovered, room left", judgement{readmits: 2, room: ptr(5)}, services.HeldEntry{Since: young}, false},
		{"recovered, no trial place", judgement{readmits: 0, room: ptr(0)}, services.HeldEntry{Since: young}, false},
		{"scored canary wait, backlog full", judgement{room: ptr(0)}, services.HeldEntry{Since: young, Hold: events.HoldCanary}, true},
		{"unproven canary wait, backlog full", judgement{first: trust.Verdict{Unproven: true}, room: ptr(0)}, services.HeldEntry{Since: young, Hold: events.HoldCanary}, false},
		{"queued, its share used", judgement{quota: 0, room: ptr(5)}, services.HeldEntry{Since: young, Hold: events.HoldQueued}, true},
		{"queued, backlog full", judgement{quota: 3, room: ptr(0)}, services.HeldEntry{Since: young, Hold: events.HoldQueued}, true},
		{"rung wait, its place taken, backlog full", judgement{room: ptr(0), stats: trust.Stats{Rungs: []trust.Canary{{Key: "t0", Rung: events.RungRefine, At: young}}}},
			services.HeldEntry{Since: young, Hold: events.HoldRung, Rung: events.RungRefine}, false},
		{"rung wait, its place free, backlog full", judgement{room: ptr(0)}, services.HeldEntry{Since: young, Hold: events.HoldRung, Rung: events.RungRefine}, true},
	} {
		short := false
		j := tt.j
		j.scoring, j.short = p, &short
		if !j.quiet(tt.e, now) {
			j.due(tt.e, now)
		}
		if short != tt.short {
			t.Errorf("%s: cut short %v, want %v", tt.name, short, tt.short)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// A type's admissions count over the last window or so: one to two
// halves back.
func TestAdmissionsSlide(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	a := newAdmissions(10 * time.Second)
	for i := range 3 {
		a.add("flood", t0.Add(time.Duration(i)*time.Second))
	}
	a.add("other", t0)
	for _, tt := range []struct {
		at   time.Duration
		want int
	}{{2 * time.Second, 3}, {6 * time.Second, 3}, {9 * time.Second, 3}, {11 * time.Second, 0}, {time.Hour, 0}} {
		if got := a.count("flood", t0.Add(tt.at)); got != tt.want {
			t.Errorf("at +%s: %d admissions, want %d", tt.at, got, tt.want)
		}
	}
	if got := a.count("other", t0.Add(time.Hour)); got != 0 {
		t.Errorf("other: %d an hour later", got)
	}
}
