package task_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

var gateNow = time.Date(2026, 5, 18, 12, 0, 0, 0, time.UTC)

// The gate's rules, one row each: the pass and its type's evidence in,
// the decision out — with the claims the decision asks for answered as
// the row says.
func TestDecide(t *testing.T) {
	p := scoring.Policy{}.WithDefaults()
	first := events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine}
	retry := events.Run{Pass: 3, Attempt: 3, Rung: events.RungPivot}
	trusted := scoring.Verdict{Score: 0.9, Outcomes: 50, Settled: 50, Threshold: p.Threshold}
	below := scoring.Verdict{Score: 0.05, Outcomes: 50, Settled: 50, Threshold: p.Threshold, Below: true, Reason: "Blocked: css_fix trust score 0.05 below 0.15"}
	probation := scoring.Verdict{Score: 0.3, Outcomes: 50, Settled: 50, Threshold: p.Threshold, Probation: true}
	unproven := scoring.Verdict{Outcomes: 2, Settled: 2, Threshold: p.Threshold, Unproven: true}
	taken := scoring.Stats{}
	for i := range p.Canary {
		taken.Canaries = append(taken.Canaries, scoring.Canary{Key: fmt.Sprintf("c%d", i), At: gateNow.Add(-time.Second)})
	}
	var failedRetries []scoring.Outcome
	for i := range 12 {
		for _, rung := range []events.Rung{events.RungPivot, events.RungResearch} {
			failedRetries = append(failedRetries, scoring.Outcome{Key: fmt.Sprintf("r%d-%s", i, rung), Task: fmt.Sprintf("r%d", i), Rung: rung, Retry: true, At: gateNow.Add(-time.Hour)})
		}
	}
	claimed := func(c task.Claim, granted bool) map[task.Claim]bool { return map[task.Claim]bool{c: granted} }
	// A retry climbing onto REFINE, which its type has no retry measured
	// on; refineTaken: the one place on it held by another task's retry.
	refine := events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine}
	refineTaken := scoring.Stats{Rungs: []scoring.Canary{{Key: "t0", Rung: events.RungRefine, At: gateNow.Add(-time.Second)}}}
	refineFailed := scoring.Stats{Outcomes: []scoring.Outcome{{Key: "t0:2:outcome", Task: "t0", Rung: events.RungRefine, Retry: true, At: gateNow.Add(-time.Second)}}}
	refineMeasured := refineFailed.Clone()
	refineMeasured.Outcomes[0].Success = true
	rungWait := func(quick bool) func(t *testing.T, out task.GateOut) {
		return func(t *testing.T, out task.GateOut) {
			if out.Hold != events.HoldRung || out.Quick != quick {
				t.Errorf("hold %q, quick %v; want a wait for the rung, quick %v", out.Hold, out.Quick, quick)
			}
		}
	}
	// backlog is the type's re-admitted held tasks, oldest first: S
	// succeeded, F failed.
	backlog := func(pattern string) scoring.Stats {
		var s scoring.Stats
		for i, c := range pattern {
			id := fmt.Sprintf("h%d", i)
			s.Outcomes = append(s.Outcomes, scoring.Outcome{Key: id + ":1:outcome", Task: id, Held: true, Success: c == 'S', End: true, At: gateNow.Add(time.Duration(i-100) * time.Second)})
		}
		return s
	}
	readmitted := func(t *testing.T, out task.GateOut) {
		if !out.Run.Readmitted {
			t.Error("not marked re-admitted")
		}
	}
	cleared := strings.Repeat("S", p.MinOutcomes)
	withStreak := func(s scoring.Stats, n int) scoring.Stats { s.BlockStreak = n; return s }
	heldLook := func(v scoring.Verdict, st scoring.Stats, c map[task.Claim]bool) task.GateIn {
		return task.GateIn{Run: first, Verdict: v, Hold: events.HoldTrust, Since: gateNow.Add(-time.Hour), Stats: st, Claimed: c}
	}

	tests := []struct {
		name   string
		in     task.GateIn
		act    task.GateAct
		ask    task.Claim
		cause  events.Cause
		reason string // a part of the reason
		check  func(t *testing.T, out task.GateOut)
	}{
		{name: "trusted", in: task.GateIn{Run: first, Verdict: trusted}, act: task.ActAdmit, cause: events.CauseTrusted},
		{name: "trusted after blocks: the streak ends", in: task.GateIn{Run: first, Verdict: trusted, Stats: scoring.Stats{BlockStreak: 3}},
			act: task.ActAdmit, cause: events.CauseTrusted, check: func(t *testing.T, out task.GateOut) {
				if !out.ResetStreak {
					t.Error("the block streak is not reset")
				}
			}},
		{name: "exempt, even below", in: task.GateIn{Run: first, Verdict: below, Exempt: true}, act: task.ActAdmit, cause: events.CauseExempt},
		{name: "a human's requeue", in: task.GateIn{Run: events.Run{Pass: 4, Attempt: 1, Reviewed: true}, Verdict: below}, act: task.ActAdmit, cause: events.CauseReviewed},
		{name: "over its daily budget", in: task.GateIn{Run: first, Verdict: trusted, OverBudget: true, Spent: scoring.Spend{Tokens: 900}},
			act: task.ActBlock, cause: events.CauseBudget, reason: "spent 900 tokens"},
		{name: "below: asks for a step of the streak", in: task.GateIn{Run: first, Verdict: below}, act: task.ActAsk, ask: task.ClaimStreak},
		{name: "below, no probe: held", in: task.GateIn{Run: first, Verdict: below, Claimed: claimed(task.ClaimStreak, false)},
			act: task.ActHold, cause: events.CauseTrust, reason: "below 0.15"},
		{name: "below, the streak's probe", in: task.GateIn{Run: first, Verdict: below, Claimed: claimed(task.ClaimStreak, true)},
			act: task.ActAdmit, cause: events.CauseProbe, check: func(t *testing.T, out task.GateOut) {
				if !out.Run.Probe || !out.Trust.Probe {
					t.Error("not marked a probe")
				}
			}},
		{name: "a retry below: held, no step asked", in: task.GateIn{Run: retry, Verdict: below}, act: task.ActHold, cause: events.CauseTrust},
		{name: "held: asks for a probe", in: task.GateIn{Run: first, Verdict: below, Hold: events.HoldTrust, Since: gateNow.Add(-time.Hour)},
			act: task.ActAsk, ask: task.ClaimProbe},
		{name: "held, no probe due: held on", in: task.GateIn{Run: first, Verdict: below, Hold: events.HoldTrust, Since: gateNow.Add(-time.Hour), Claimed: claimed(task.ClaimProbe, false)},
			act: task.ActHold, cause: events.CauseTrust},
		{name: "held past its hold time: to a human", in: task.GateIn{Run: first, Verdict: below, Hold: events.HoldTrust, Since: gateNow.Add(-p.HoldTime), Claimed: claimed(task.ClaimProbe, false)},
			act: task.ActBlock, cause: events.CauseTrust, reason: "without recovering"},
		{name: "held, on probation: asks for a trial place", in: task.GateIn{Run: first, Verdict: probation, Hold: events.HoldTrust, Since: gateNow.Add(-time.Hour)},
			act: task.ActAsk, ask: task.ClaimTrial},
		{name: "held, on probation, no place: sleeps", in: task.GateIn{Run: first, Verdict: probation, Hold: events.HoldTrust, Since: gateNow.Add(-time.Hour), Claimed: claimed(task.ClaimTrial, false)},
			act: task.ActSleep},
		{name: "held past its hold time, on probation, no place: to a human", in: task.GateIn{Run: first, Verdict: probation, Hold: events.HoldTrust, Since: gateNow.Add(-p.HoldTime), Claimed: claimed(task.ClaimTrial, false)},
			act: task.ActBlock, cause: events.CauseTrust, reason: "without a place"},
		{name: "held, on probation, a place: re-admitted", in: task.GateIn{Run: first, Verdict: probation, Hold: events.HoldTrust, Since: gateNow.Add(-time.Hour), Claimed: claimed(task.ClaimTrial, true)},
			act: task.ActAdmit, cause: events.CauseTrusted, reason: "re-admitted", check: readmitted},
		{name: "held, recovered: asks for a trial place until its backlog clears", in: heldLook(trusted, backlog("SS"), nil), act: task.ActAsk, ask: task.ClaimTrial},
		{name: "held, recovered, a place: re-admitted", in: heldLook(trusted, backlog("SS"), claimed(task.ClaimTrial, true)),
			act: task.ActAdmit, cause: events.CauseTrusted, reason: "recovered", check: readmitted},
		{name: "held, recovered, backlog cleared: re-admitted, no place asked", in: heldLook(trusted, backlog(cleared), nil),
			act: task.ActAdmit, cause: events.CauseTrusted, check: readmitted},
		{name: "held, the last re-admitted failed: one at a time", in: heldLook(trusted, backlog(cleared+"F"), claimed(task.ClaimTrial, true)),
			act: task.ActAdmit, reason: "one at a time", check: readmitted},
		{name: "held, the backlog paused: asks for a probe", in: heldLook(trusted, backlog("SFF"), nil), act: task.ActAsk, ask: task.ClaimProbe},
		{name: "held, the backlog paused, not due: sleeps", in: heldLook(trusted, backlog("SFF"), claimed(task.ClaimProbe, false)),
			act: task.ActSleep, cause: events.CauseTrust, reason: "at the probe pace"},
		{name: "held past its hold time, the backlog in doubt: to a human, nothing asked",
			in:  task.GateIn{Run: first, Verdict: trusted, Hold: events.HoldTrust, Since: gateNow.Add(-p.HoldTime), Stats: backlog("F")},
			act: task.ActBlock, cause: events.CauseTrust},
		{name: "held past its hold time, the backlog paused: to a human, nothing asked",
			in:  task.GateIn{Run: first, Verdict: trusted, Hold: events.HoldTrust, Since: gateNow.Add(-p.HoldTime), Stats: backlog("FF")},
			act: task.ActBlock, cause: events.CauseTrust},
		{name: "held, the backlog paused, due: re-admitted at the probe pace, no probe", in: heldLook(trusted, backlog("SFF"), claimed(task.ClaimProbe, true)),
			act: task.ActAdmit, cause: events.CauseTrusted, reason: "probe pace", check: func(t *testing.T, out task.GateOut) {
				readmitted(t, out)
				if out.Run.Probe {
					t.Error("marked a probe: its failure would close the type for new tasks")
				}
			}},
		{name: "held, exempt now, the backlog paused: re-admitted", in: task.GateIn{Run: first, Verdict: trusted, Exempt: true, Hold: events.HoldTrust, Since: gateNow.Add(-time.Hour), Stats: backlog("FF")},
			act: task.ActAdmit, cause: events.CauseExempt, check: readmitted},
		{name: "a re-admitted task's retry, two before it ended failed: handed off",
			in:  task.GateIn{Run: events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine, Readmitted: true}, Verdict: trusted, Stats: backlog("FF")},
			act: task.ActHandoff, cause: events.CauseRungRate, reason: "re-admitted ended failed"},
		{name: "a re-admitted task's retry, its siblings still climbing: goes on",
			in: task.GateIn{Run: events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine, Readmitted: true}, Verdict: trusted, Stats: scoring.Stats{Outcomes: []scoring.Outcome{
				{Key: "h1:1:outcome", Task: "h1", Held: true, At: gateNow.Add(-2 * time.Second)},
				{Key: "h2:1:outcome", Task: "h2", Held: true, At: gateNow.Add(-time.Second)}}}, Claimed: claimed(task.ClaimRung, true)},
			act: task.ActAdmit, cause: events.CauseTrusted},
		{name: "a probe's retry, the backlog's ended failures before it: goes on",
			in:  task.GateIn{Run: events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine, Readmitted: true, Probe: true}, Verdict: below, Stats: backlog("FF")},
			act: task.ActAdmit, cause: events.CauseProbe},
		{name: "trusted after blocks, but the backlog puts it back to sleep: the streak stays",
			in:  task.GateIn{Run: first, Verdict: trusted, Hold: events.HoldTrust, Since: gateNow.Add(-time.Hour), Stats: withStreak(backlog("SFF"), 3), Claimed: claimed(task.ClaimProbe, false)},
			act: task.ActSleep, check: func(t *testing.T, out task.GateOut) {
				if out.ResetStreak {
					t.Error("the streak is reset by a pass that did not go")
				}
			}},
		{name: "a new task's retry, the backlog paused: goes on", in: task.GateIn{Run: events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine}, Verdict: trusted, Stats: backlog("FF"), Claimed: claimed(task.ClaimRung, true)},
			act: task.ActAdmit, cause: events.CauseTrusted},
		{name: "a verified pass is not re-admitted", in: task.GateIn{Run: first, Verdict: trusted, Stats: backlog("FF")},
			act: task.ActAdmit, check: func(t *testing.T, out task.GateOut) {
				if out.Run.Readmitted {
					t.Error("marked re-admitted")
				}
			}},
		{name: "a retry whose rungs rarely pay: handed off", in: task.GateIn{Run: retry, Verdict: trusted, Stats: scoring.Stats{Outcomes: failedRetries}},
			act: task.ActHandoff, cause: events.CauseRungRate, reason: "HANDOFF before attempt 3"},
		{name: "a retry onto a rung its type never measured: asks for a place", in: task.GateIn{Run: refine, Verdict: trusted}, act: task.ActAsk, ask: task.ClaimRung},
		{name: "a retry onto an unmeasured rung, a place: goes", in: task.GateIn{Run: refine, Verdict: trusted, Claimed: claimed(task.ClaimRung, true)},
			act: task.ActAdmit, cause: events.CauseTrusted},
		{name: "a retry onto an unmeasured rung, no place: parked", in: task.GateIn{Run: refine, Verdict: trusted, Arrived: gateNow, Claimed: claimed(task.ClaimRung, false)},
			act: task.ActPark, cause: events.CauseTrusted, reason: "waiting for the REFINE retries of css_fix being measured", check: rungWait(false)},
		{name: "a look at a retry waiting for its rung, every place taken: waits on, quick",
			in:  task.GateIn{Run: refine, Verdict: trusted, Hold: events.HoldRung, Since: gateNow, Delivered: 3, Stats: refineTaken},
			act: task.ActWait, check: rungWait(true)},
		{name: "a woken look at a retry waiting for its rung: asks", in: task.GateIn{Run: refine, Verdict: trusted, Hold: events.HoldRung, Since: gateNow, Delivered: 3, Woken: true, Stats: refineTaken},
			act: task.ActAsk, ask: task.ClaimRung},
		{name: "a look at a retry waiting for its rung, refused: waits on", in: task.GateIn{Run: refine, Verdict: trusted, Hold: events.HoldRung, Since: gateNow, Woken: true, Claimed: claimed(task.ClaimRung, false)},
			act: task.ActWait, check: rungWait(false)},
		{name: "waited the canary TTL for its rung: goes", in: task.GateIn{Run: refine, Verdict: trusted, Hold: events.HoldRung, Since: gateNow.Add(-p.CanaryTTL), Woken: true, Claimed: claimed(task.ClaimRung, false)},
			act: task.ActAdmit, cause: events.CauseTrusted, reason: "waited 10m0s for the REFINE retries"},
		{name: "a retry onto a measured rung: no place asked", in: task.GateIn{Run: refine, Verdict: trusted, Stats: refineMeasured}, act: task.ActAdmit, cause: events.CauseTrusted},
		{name: "a retry onto a rung whose only retry failed: a place asked", in: task.GateIn{Run: refine, Verdict: trusted, Stats: refineFailed}, act: task.ActAsk, ask: task.ClaimRung},
		{name: "an exempt type's retry: no place asked", in: task.GateIn{Run: refine, Verdict: trusted, Exempt: true}, act: task.ActAdmit, cause: events.CauseExempt},
		{name: "a retry held for trust, re-admitted: no place asked", in: task.GateIn{Run: refine, Verdict: trusted, Hold: events.HoldTrust, Since: gateNow.Add(-time.Hour), Stats: backlog(cleared)},
			act: task.ActAdmit, cause: events.CauseTrusted, check: readmitted},
		{name: "a canary's retry: its canary place first, then a rung place", in: task.GateIn{Run: refine, Verdict: unproven}, act: task.ActAsk, ask: task.ClaimCanary},
		{name: "a canary's retry, its canary place held: asks for a rung place", in: task.GateIn{Run: refine, Verdict: unproven, Claimed: claimed(task.ClaimCanary, true)},
			act: task.ActAsk, ask: task.ClaimRung},
		{name: "a retry parked for its rung after blocks: the streak stays", in: task.GateIn{Run: refine, Verdict: trusted, Arrived: gateNow, Stats: withStreak(scoring.Stats{}, 3), Claimed: claimed(task.ClaimRung, false)},
			act: task.ActPark, check: func(t *testing.T, out task.GateOut) {
				if out.ResetStreak {
					t.Error("the streak is reset by a retry its look may still hand off")
				}
			}},
		{name: "a probe's retry: no place asked", in: task.GateIn{Run: events.Run{Pass: 2, Attempt: 2, Rung: events.RungRefine, Probe: true}, Verdict: below}, act: task.ActAdmit, cause: events.CauseProbe},
		{name: "unproven: asks for a canary place", in: task.GateIn{Run: first, Verdict: unproven}, act: task.ActAsk, ask: task.ClaimCanary},
		{name: "unproven, a place: a canary", in: task.GateIn{Run: first, Verdict: unproven, Claimed: claimed(task.ClaimCanary, true)},
			act: task.ActAdmit, cause: events.CauseUnproven},
		{name: "unproven, no place: parked", in: task.GateIn{Run: first, Verdict: unproven, Delivered: 2, Arrived: gateNow, Claimed: claimed(task.ClaimCanary, false)},
			act: task.ActPark, cause: events.CauseUnproven, reason: "waiting for the canaries"},
		{name: "a flood's pass, every place taken: parked at once", in: task.GateIn{Run: first, Verdict: unproven, Delivered: 1, Arrived: gateNow, Stats: taken},
			act: task.ActPark, cause: events.CauseUnproven, check: func(t *testing.T, out task.GateOut) {
				if !out.Quick {
					t.Error("not quick: it reads nothing")
				}
			}},
		{name: "crowded: a trusted first pass waits its turn", in: task.GateIn{Run: first, Verdict: trusted, Crowded: true},
			act: task.ActPark, cause: events.CauseTrusted, reason: "waiting its turn", check: func(t *testing.T, out task.GateOut) {
				if out.Hold != events.HoldQueued {
					t.Errorf("parked for %q, want queued", out.Hold)
				}
			}},
		{name: "crowded: a retry goes on", in: task.GateIn{Run: retry, Verdict: trusted, Crowded: true, Stats: scoring.Stats{}, Claimed: claimed(task.ClaimRung, true)},
			act: task.ActAdmit, cause: events.CauseTrusted},
		{name: "crowded: an exempt type goes", in: task.GateIn{Run: first, Verdict: trusted, Exempt: true, Crowded: true},
			act: task.ActAdmit, cause: events.CauseExempt},
		{name: "crowded: a human's requeue goes", in: task.GateIn{Run: events.Run{Pass: 2, Attempt: 1, Reviewed: true}, Verdict: trusted, Crowded: true},
			act: task.ActAdmit, cause: events.CauseReviewed},
		{name: "crowded: a canary goes", in: task.GateIn{Run: first, Verdict: unproven, Crowded: true, Claimed: claimed(task.ClaimCanary, true)},
			act: task.ActAdmit, cause: events.CauseUnproven},
		{name: "a queued pass's first look: asleep until woken, quick", in: task.GateIn{Run: first, Verdict: trusted, Hold: events.HoldQueued, Since: gateNow},
			act: task.ActWait, check: func(t *testing.T, out task.GateOut) {
				if !out.Quick || out.Hold != events.HoldQueued {
					t.Errorf("quick %v, hold %q; want a quick wait for its turn", out.Quick, out.Hold)
				}
			}},
		{name: "a queued pass woken: goes, even crowded", in: task.GateIn{Run: first, Verdict: trusted, Hold: events.HoldQueued, Since: gateNow, Woken: true, Crowded: true},
			act: task.ActAdmit, cause: events.CauseTrusted},
		{name: "a waiting look, every place taken: waits on, quick", in: task.GateIn{Run: first, Verdict: unproven, Hold: events.HoldCanary, Since: gateNow, Delivered: 3, Stats: taken},
			act: task.ActWait, check: func(t *testing.T, out task.GateOut) {
				if !out.Quick {
					t.Error("not quick")
				}
			}},
		{name: "every eighth look asks anyway", in: task.GateIn{Run: first, Verdict: unproven, Hold: events.HoldCanary, Since: gateNow, Delivered: task.FullLookEvery, Stats: taken},
			act: task.ActAsk, ask: task.ClaimCanary},
		{name: "a waiting look refused: waits on", in: task.GateIn{Run: first, Verdict: unproven, Hold: events.HoldCanary, Since: gateNow, Delivered: task.FullLookEvery, Claimed: claimed(task.ClaimCanary, false)},
			act: task.ActWait},
		{name: "waited the canary TTL: goes", in: task.GateIn{Run: first, Verdict: unproven, Hold: events.HoldCanary, Since: gateNow.Add(-p.CanaryTTL), Delivered: 9, Claimed: claimed(task.ClaimCanary, false)},
			act: task.ActAdmit, cause: events.CauseUnproven, reason: "waited 10m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Task = events.Task{ID: "t1", Type: "css_fix"}
			in.Now, in.Scoring = gateNow, p
			out := task.Decide(in)
			if out.Act != tt.act || out.Ask != tt.ask || (tt.cause != "" && out.Trust.Cause != tt.cause) || !strings.Contains(out.Trust.Reason, tt.reason) {
				t.Fatalf("Decide = %s %q, cause %q, reason %q; want %s %q, cause %q, reason with %q",
					out.Act, out.Ask, out.Trust.Cause, out.Trust.Reason, tt.act, tt.ask, tt.cause, tt.reason)
			}
			if tt.check != nil {
				tt.check(t, out)
			}
		})
	}
}

// A held backlog that failed when re-admitted is looked at newest first
// (the sweeper's wakes, the what-if's looks), but the passes past their
// hold time still go first, oldest first; otherwise oldest first.
func TestWakeOrder(t *testing.T) {
	hold := 24 * time.Hour
	var held []time.Time // when each was held, oldest first
	for _, age := range []time.Duration{2 * hold, hold, time.Hour, time.Minute, time.Second} {
		held = append(held, gateNow.Add(-age))
	}
	since := func(at time.Time) time.Time { return at }
	got := task.WakeOrder(held, since, true, hold, gateNow)
	want := []time.Time{held[0], held[1], held[4], held[3], held[2]}
	if !slices.Equal(got, want) {
		t.Fatalf("newest first: %v, want %v", got, want)
	}
	if !held[4].Equal(gateNow.Add(-time.Second)) {
		t.Fatal("the held passes were reordered in place")
	}
	if got := task.WakeOrder(held, since, false, hold, gateNow); !slices.Equal(got, held) {
		t.Fatalf("oldest first: %v, want them as held", got)
	}
}
