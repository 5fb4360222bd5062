package scoring_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

func TestPolicyRecord(t *testing.T) {
	p := scoring.Policy{Window: 3}
	var st scoring.Stats
	for i, o := range seq("SFSF") {
		next, changed := p.Record(st, o)
		if !changed {
			t.Fatalf("outcome %d not recorded", i)
		}
		st = next
	}
	if ok, failed := st.Counts(); ok != 1 || failed != 2 { // the window of 3: F S F
		t.Errorf("counts = %d/%d, want 1/2", ok, failed)
	}
	keys := func(s scoring.Stats) []string {
		var k []string
		for _, o := range s.Outcomes {
			k = append(k, o.Key)
		}
		return k
	}
	if got, want := keys(st), []string{"t1:1", "t2:1", "t3:1"}; !slices.Equal(got, want) {
		t.Errorf("window = %v, want %v", got, want)
	}

	before := slices.Clone(st.Outcomes)
	same, changed := p.Record(st, seq("SFSF")[3])
	if changed || len(same.Outcomes) != 3 {
		t.Errorf("duplicate key recorded: changed=%v %+v", changed, same)
	}
	if _, changed := p.Record(st, scoring.Outcome{Key: "new", Success: true, At: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)}); !changed {
		t.Error("new key not recorded")
	}
	if !slices.Equal(st.Outcomes, before) {
		t.Errorf("Record modified its input: %v, was %v", st.Outcomes, before)
	}
}

func TestPolicyGate(t *testing.T) {
	type step struct {
		key     string
		below   bool
		probe   bool
		streak  int
		changed bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"admit on a clean type writes nothing", []step{{"a", false, false, 0, false}}},
		{"five blocks then a probe", []step{
			{"a", true, false, 1, true}, {"b", true, false, 2, true}, {"c", true, false, 3, true},
			{"d", true, false, 4, true}, {"e", true, false, 5, true},
			{"f", true, true, 0, true},
			{"g", true, false, 1, true},
		}},
		{"redelivery keeps the decision", []step{
			{"a", true, false, 1, true}, {"a", true, false, 1, false}, {"a", false, false, 1, false},
		}},
		{"admit resets the streak", []step{
			{"a", true, false, 1, true}, {"b", true, false, 2, true}, {"c", false, false, 0, true}, {"d", false, false, 0, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p scoring.Policy
			st := scoring.Stats{Type: "css_fix"}
			for i, s := range tt.steps {
				next, probe, changed := p.Gate(st, s.key, s.below)
				if probe != s.probe || next.BlockStreak != s.streak || changed != s.changed {
					t.Fatalf("step %d (%s, below=%v): probe=%v streak=%d changed=%v; want %v %d %v",
						i, s.key, s.below, probe, next.BlockStreak, changed, s.probe, s.streak, s.changed)
				}
				st = next
			}
		})
	}
}

func TestPolicyGateProbeRedelivery(t *testing.T) {
	var p scoring.Policy
	st := scoring.Stats{BlockStreak: 5, Gates: []scoring.GateMark{{Key: "e"}}}
	st, probe, _ := p.Gate(st, "f", true)
	if !probe {
		t.Fatal("no probe after 5 blocks")
	}
	_, again, changed := p.Gate(st, "f", true)
	if !again || changed {
		t.Errorf("redelivered probe: probe=%v changed=%v, want true false", again, changed)
	}
	// Another task is blocked in between; the probe's redelivery still gets its answer.
	st, blocked, _ := p.Gate(st, "g", true)
	if blocked || st.BlockStreak != 1 {
		t.Fatalf("task after the probe: probe=%v streak=%d", blocked, st.BlockStreak)
	}
	if _, again, changed := p.Gate(st, "f", true); !again || changed || st.BlockStreak != 1 {
		t.Errorf("probe redelivered after another block: probe=%v changed=%v", again, changed)
	}
}

// An outcome recorded again after it left a full window — a recorder killed
// after its update, redelivered behind newer outcomes — changes nothing.
func TestPolicyRecordLateDuplicate(t *testing.T) {
	p := scoring.Policy{Window: 3}
	all := seq("FSSSS")
	var st scoring.Stats
	for _, o := range all {
		st, _ = p.Record(st, o)
	}
	again, _ := p.Record(st, all[0])
	if !slices.Equal(again.Outcomes, st.Outcomes) {
		t.Fatalf("a late duplicate changed the window: %v, was %v", again.Outcomes, st.Outcomes)
	}
}

// Clone copies every slice: a change to the copy leaves the original as
// its JSON says it was.
func TestStatsClone(t *testing.T) {
	at := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	st := scoring.Stats{Type: "css_fix", BlockStreak: 2,
		Outcomes: []scoring.Outcome{{Key: "a:1", Success: true, At: at, Tokens: 10, Rung: events.RungRefine}, {Key: "b:1", At: at, Retry: true}},
		Gates:    []scoring.GateMark{{Key: "c:1", Probe: true}},
		Canaries: []scoring.Canary{{Key: "d", At: at}},
		Rungs:    []scoring.Canary{{Key: "e", At: at, Rung: events.RungPivot}},
	}
	before, _ := json.Marshal(st)
	c := st.Clone()
	if after, _ := json.Marshal(c); string(after) != string(before) {
		t.Fatalf("clone %s, want %s", after, before)
	}
	c.Outcomes[0].Key, c.Gates[0].Key, c.Canaries[0].Key, c.Rungs[0].Key = "x", "x", "x", "x"
	c.Outcomes = append(c.Outcomes[:1], scoring.Outcome{Key: "y"})
	if after, _ := json.Marshal(st); string(after) != string(before) {
		t.Fatalf("changing the clone changed the original: %s, want %s", after, before)
	}
}

// StreakStep is the one rule the gate steps a block streak by and rebuild
// replays it by.
func TestStreakStep(t *testing.T) {
	for _, tt := range []struct {
		name         string
		cause        events.Cause
		probe        bool
		attempt      int
		heldForTrust bool
		step, below  bool
	}{
		{"a new task below: held", events.CauseTrust, false, 1, false, true, true},
		{"a new task below: its streak's probe", events.CauseProbe, true, 1, false, true, true},
		{"a probe's retry", events.CauseProbe, false, 2, false, false, false},
		{"a retry below", events.CauseTrust, false, 3, false, false, false},
		{"a held pass stopped at its hold time", events.CauseTrust, false, 1, true, false, false},
		{"a held pass probed", events.CauseProbe, true, 1, true, false, false},
		{"trusted resets", events.CauseTrusted, false, 1, false, true, false},
		{"a held pass re-admitted trusted resets", events.CauseTrusted, false, 1, true, true, false},
		{"a trusted retry resets", events.CauseTrusted, false, 4, false, true, false},
		{"exempt", events.CauseExempt, false, 1, false, false, false},
		{"budget", events.CauseBudget, false, 1, false, false, false},
		{"reviewed", events.CauseReviewed, false, 1, false, false, false},
		{"rung rate", events.CauseRungRate, false, 2, false, false, false},
		{"unproven", events.CauseUnproven, false, 1, false, false, false},
		{"no cause", "", true, 1, false, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			step, below := scoring.StreakStep(tt.cause, tt.probe, tt.attempt, tt.heldForTrust)
			if step != tt.step || below != tt.below {
				t.Fatalf("StreakStep = %v, %v; want %v, %v", step, below, tt.step, tt.below)
			}
		})
	}
}
