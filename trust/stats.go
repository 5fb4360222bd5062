package trust

import (
	"slices"
	"time"
)

// Stats is what the store keeps for one task type.
type Stats struct {
	Type string `json:"type"`
	// Outcomes is the window, oldest first, at most Policy.Window entries.
	Outcomes []Outcome `json:"outcomes"`
	// Successes and Failures are lifetime totals, not windowed.
	Successes int `json:"successes"`
	Failures  int `json:"failures"`
	// BlockStreak counts consecutive gate blocks of this type.
	BlockStreak int `json:"block_streak"`
	// Gates are the recent gate decisions that changed the streak (the last
	// GateMemory), so a redelivered gate call gets the same answer even after
	// other tasks of the type went through the gate.
	Gates []GateMark `json:"gates,omitempty"`
	// Daily is what the type spent per UTC day ("2006-01-02"), the last
	// SpendDays days kept; the gate enforces a type's daily budget with it.
	Daily map[string]Spend `json:"daily,omitempty"`
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

// SpendDays is how many days of spend Stats keeps.
const SpendDays = 7

// Day is the key of t's UTC day in Stats.Daily.
func Day(t time.Time) string { return t.UTC().Format("2006-01-02") }

// SpentOn is what the type spent on t's UTC day.
func (s Stats) SpentOn(t time.Time) Spend { return s.Daily[Day(t)] }

// Record returns s with outcome o appended, the window trimmed to p.Window
// and the lifetime totals bumped. When an outcome with o.Key is already in
// the window it returns s unchanged and changed=false. (An outcome already
// trimmed out of the window would be counted again.) s is not modified.
func (p Policy) Record(s Stats, o Outcome) (next Stats, changed bool) {
	p = p.WithDefaults()
	if slices.ContainsFunc(s.Outcomes, func(x Outcome) bool { return x.Key == o.Key }) {
		return s, false
	}
	// Keep the window in (At, Key) order whatever order outcomes arrive in,
	// so a replay of the stream (dispatch rebuild) yields the same window.
	i := len(s.Outcomes)
	for i > 0 && outcomeAfter(s.Outcomes[i-1], o) {
		i--
	}
	next = s
	next.Outcomes = lastN(slices.Insert(slices.Clone(s.Outcomes), i, o), p.Window)
	if o.Success {
		next.Successes++
	} else {
		next.Failures++
	}
	if o.Tokens != 0 || o.Cost != 0 {
		next.Daily = make(map[string]Spend, len(s.Daily)+1)
		oldest := Day(o.At.AddDate(0, 0, -SpendDays+1))
		for day, sp := range s.Daily {
			if day >= oldest {
				next.Daily[day] = sp
			}
		}
		sp := next.Daily[Day(o.At)]
		sp.Tokens += o.Tokens
		sp.Cost += o.Cost
		next.Daily[Day(o.At)] = sp
	}
	return next, true
}

// Gate returns the stats after a gate decision for the task identified by
// key, where below is Evaluate's Verdict.Below:
//
//   - key is a remembered gate key: a redelivery, the stored decision is
//     returned and nothing changes;
//   - not below: the block streak is reset (changed=false when it already
//     was 0, so the hot path needs no write);
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
		next.BlockStreak = 0
	case s.BlockStreak >= p.ProbeAfter:
		next.BlockStreak = 0
		probe = true
	default:
		next.BlockStreak++
	}
	next.Gates = append(slices.Clone(lastN(s.Gates, GateMemory-1)), GateMark{Key: key, Probe: probe})
	return next, probe, true
}

func outcomeAfter(a, b Outcome) bool {
	if !a.At.Equal(b.At) {
		return a.At.After(b.At)
	}
	return a.Key > b.Key
}
