package executor

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	t0 := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	cfg := CircuitConfig{Threshold: 3, CoolDown: 10 * time.Second, MaxCoolDown: 25 * time.Second}

	// step is one event: an allow (and its answer) or a done.
	type step struct {
		at int // seconds after t0
		// allow: want ok, probe and wait (seconds)
		allow           bool
		ok, probe       bool
		wait            int
		done, probeDone bool // done: report an outcome (failed says how)
		failed          bool
		release         bool
		// the state after the step
		state int
	}
	allow := func(at int, ok, probe bool, wait, state int) step {
		return step{at: at, allow: true, ok: ok, probe: probe, wait: wait, state: state}
	}
	fail := func(at int, probe bool, state int) step {
		return step{at: at, done: true, probeDone: probe, failed: true, state: state}
	}
	succeed := func(at int, probe bool, state int) step {
		return step{at: at, done: true, probeDone: probe, state: state}
	}
	tests := []struct {
		name  string
		cfg   CircuitConfig
		steps []step
	}{
		{"closed lets everything through", cfg, []step{
			allow(0, true, false, 0, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitClosed),
			succeed(0, false, CircuitClosed), // resets the count
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), allow(1, true, false, 0, CircuitClosed),
		}},
		{"threshold opens, cool-down holds", cfg, []step{
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(2, false, CircuitOpen),
			allow(2, false, false, 10, CircuitOpen), allow(11, false, false, 1, CircuitOpen),
		}},
		{"probe success closes", cfg, []step{
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitOpen),
			allow(10, true, true, 0, CircuitHalfOpen),
			allow(11, false, false, 9, CircuitHalfOpen), // the others wait for the probe
			succeed(12, true, CircuitClosed),
			allow(12, true, false, 0, CircuitClosed),
			fail(12, false, CircuitClosed), fail(12, false, CircuitClosed), // the count started over
		}},
		{"probe failure doubles the cool-down up to the cap", cfg, []step{
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitOpen),
			allow(10, true, true, 0, CircuitHalfOpen), fail(10, true, CircuitOpen),
			allow(29, false, false, 1, CircuitOpen),
			allow(30, true, true, 0, CircuitHalfOpen), fail(30, true, CircuitOpen),
			allow(54, false, false, 1, CircuitOpen), // 25s cap, not 40s
			allow(55, true, true, 0, CircuitHalfOpen), succeed(55, true, CircuitClosed),
		}},
		{"a deterministic answer to the probe closes", cfg, []step{
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitOpen),
			allow(10, true, true, 0, CircuitHalfOpen), succeed(10, true, CircuitClosed),
		}},
		{"late outcomes of other calls are ignored while open", cfg, []step{
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitOpen),
			succeed(1, false, CircuitOpen), fail(1, false, CircuitOpen),
			allow(10, true, true, 0, CircuitHalfOpen), succeed(10, false, CircuitHalfOpen), fail(10, false, CircuitHalfOpen),
			allow(10, false, false, 10, CircuitHalfOpen),
		}},
		{"a lost probe is given up after a cool-down", cfg, []step{
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitOpen),
			allow(10, true, true, 0, CircuitHalfOpen), allow(19, false, false, 1, CircuitHalfOpen),
			allow(20, true, true, 0, CircuitHalfOpen),
		}},
		{"a released probe lets the next caller probe", cfg, []step{
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitOpen),
			allow(10, true, true, 0, CircuitHalfOpen), {at: 11, release: true, state: CircuitHalfOpen},
			allow(11, true, true, 0, CircuitHalfOpen),
		}},
		{"defaults: 5 failures, 30s", CircuitConfig{}, []step{
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitClosed),
			fail(0, false, CircuitOpen), allow(0, false, false, 30, CircuitOpen),
		}},
		{"disabled", CircuitConfig{Threshold: -1}, []step{
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitClosed),
			fail(0, false, CircuitClosed), fail(0, false, CircuitClosed), fail(0, false, CircuitClosed),
			allow(0, true, false, 0, CircuitClosed),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg.withDefaults()
			var b circuit
			for i, s := range tt.steps {
				switch {
				case s.allow:
					next, ok, probe, wait, _ := b.allow(cfg, at(s.at))
					b = next
					if ok != s.ok || probe != s.probe || wait != time.Duration(s.wait)*time.Second {
						t.Fatalf("step %d: allow at %ds = %v, %v, %v; want %v, %v, %ds", i, s.at, ok, probe, wait, s.ok, s.probe, s.wait)
					}
				case s.done:
					b, _, _ = b.done(cfg, at(s.at), s.probeDone, s.failed)
				case s.release:
					b, _ = b.release(at(s.at), true)
				}
				if state := b.State; state != s.state {
					t.Fatalf("step %d: state %d, want %d", i, state, s.state)
				}
			}
		})
	}
}
