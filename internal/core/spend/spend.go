// Package spend folds task states into the spend figures, per task type and
// over all types: what was spent, how much of it went to tasks that ended
// unresolved, how often a retry succeeds, how many attempts a resolved task
// takes, what a resolved task costs, how often a request repeated one that
// had failed, how often a retry failed with the same error, and the prompt
// tokens of an attempt on each rung.
//
// It is pure. `dispatch stats` feeds it the states of the task store; the
// recorder's Prometheus metrics use its per-attempt rules (Retry, SameError,
// Refused, Round), so the two count the same things.
package spend

import (
	"cmp"
	"maps"
	"slices"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Figures are the spend figures of a set of tasks: one type's, or all.
// Tokens are prompt plus completion tokens; Cost is USD. A rate whose
// denominator is 0 is nil (JSON null), not 0.
type Figures struct {
	// Type is the task type; "" in the total over all types.
	Type string `json:"type"`
	// Tasks = Open + Resolved + Unresolved.
	Tasks int `json:"tasks"`
	// Open tasks have not ended: pending, verifying, running or parked.
	Open int `json:"open"`
	// Resolved tasks succeeded (see Resolved); Unresolved ones ended
	// otherwise (see Unresolved).
	Resolved   int `json:"resolved"`
	Unresolved int `json:"unresolved"`
	// Tokens and Cost are what every task spent, open ones included: its
	// recorded attempts plus what an attempt under way spent before a
	// transient failure (TaskState.Unbilled).
	Tokens int     `json:"tokens"`
	Cost   float64 `json:"cost"`
	// ResolvedTokens and ResolvedCost are what the resolved tasks spent.
	ResolvedTokens int     `json:"resolved_tokens"`
	ResolvedCost   float64 `json:"resolved_cost"`
	// WastedTokens and WastedCost are what the unresolved tasks spent.
	WastedTokens int     `json:"wasted_tokens"`
	WastedCost   float64 `json:"wasted_cost"`
	// Attempts counts attempt records (refused ones included);
	// ResolvedAttempts those of the resolved tasks.
	Attempts         int `json:"attempts"`
	ResolvedAttempts int `json:"resolved_attempts"`
	// Retries counts the attempts made after a failed one (see Retry);
	// RetrySuccesses those that succeeded.
	Retries        int `json:"retries"`
	RetrySuccesses int `json:"retry_successes"`
	// Refused counts the attempts whose request was refused for repeating
	// one that had failed deterministically (see Refused).
	Refused int `json:"refused"`
	// SameErrorRetries counts the failed attempts whose reason equals the
	// task's previous failure's (see SameError).
	SameErrorRetries int `json:"same_error_retries"`
	// Rungs are the attempts per rung (see RungLabel).
	Rungs map[string]Rung `json:"rungs,omitempty"`

	// RetrySuccessRate = RetrySuccesses / Retries.
	RetrySuccessRate *float64 `json:"retry_success_rate"`
	// LoopRate = ResolvedAttempts / Resolved: attempts per resolved task.
	LoopRate *float64 `json:"loop_rate"`
	// CostPerResolved = ResolvedCost / Resolved and TokensPerResolved =
	// ResolvedTokens / Resolved: what a resolved task spent on average. What
	// the unresolved ones wasted besides is WastedCost.
	CostPerResolved   *float64 `json:"cost_per_resolved"`
	TokensPerResolved *float64 `json:"tokens_per_resolved"`
	// RepeatCallRate = Refused / Attempts: the share of requests made (sent
	// or refused, one per attempt) that repeated a failed one.
	RepeatCallRate *float64 `json:"repeat_call_rate"`
}

// Rung is the attempts made on one rung.
type Rung struct {
	Attempts int `json:"attempts"`
	// Prompted counts the attempts that report prompt tokens (TokensIn > 0:
	// not refused, not a command step); PromptTokens sums them.
	Prompted     int `json:"prompted"`
	PromptTokens int `json:"prompt_tokens"`
	// PromptTokensPerAttempt = PromptTokens / Prompted. An attempt's
	// TokensIn sums every model call it made (each turn of a tool loop, and
	// calls cut short by transient failures), so this is per attempt, not
	// per call: the executor's dispatch_prompt_tokens histogram is per call.
	PromptTokensPerAttempt *float64 `json:"prompt_tokens_per_attempt"`
}

// Report is the figures of every type and their total.
type Report struct {
	// Types are sorted by type.
	Types []Figures `json:"types"`
	Total Figures   `json:"total"`
}

// Tally folds task states into figures. The zero value is ready to use.
type Tally struct {
	types map[string]*Figures
	total Figures
}

// Add counts one task.
func (t *Tally) Add(st events.TaskState) {
	if t.types == nil {
		t.types = map[string]*Figures{}
	}
	f := t.types[st.Type]
	if f == nil {
		f = &Figures{Type: st.Type}
		t.types[st.Type] = f
	}
	f.add(&st)
	t.total.add(&st)
}

// Report returns the figures counted so far.
func (t *Tally) Report() Report {
	r := Report{Types: make([]Figures, 0, len(t.types)), Total: t.total.derive()}
	for _, typ := range slices.Sorted(maps.Keys(t.types)) {
		r.Types = append(r.Types, t.types[typ].derive())
	}
	return r
}

// Fold is the report of states.
func Fold(states ...events.TaskState) Report {
	var t Tally
	for _, st := range states {
		t.Add(st)
	}
	return t.Report()
}

func (f *Figures) add(st *events.TaskState) {
	tokens := st.TokensIn + st.TokensOut + st.Unbilled.TokensIn + st.Unbilled.TokensOut
	cost := st.Cost + st.Unbilled.Cost
	f.Tasks++
	f.Tokens += tokens
	f.Cost += cost
	switch {
	case Resolved(st.Status):
		f.Resolved++
		f.ResolvedTokens += tokens
		f.ResolvedCost += cost
		f.ResolvedAttempts += len(st.History)
	case Unresolved(st.Status):
		f.Unresolved++
		f.WastedTokens += tokens
		f.WastedCost += cost
	default:
		f.Open++
	}
	f.Attempts += len(st.History)
	f.Refused += refusedOf(st)
	if f.Rungs == nil && len(st.History) > 0 {
		f.Rungs = map[string]Rung{}
	}
	for i, r := range st.History {
		if Retry(st.History, i) {
			f.Retries++
			if r.Outcome == events.OutcomeSuccess {
				f.RetrySuccesses++
			}
		}
		if SameError(st.History, i) {
			f.SameErrorRetries++
		}
		label := RungLabel(r.Rung)
		g := f.Rungs[label]
		g.Attempts++
		if r.TokensIn > 0 {
			g.Prompted++
			g.PromptTokens += r.TokensIn
		}
		f.Rungs[label] = g
	}
}

// derive returns a copy of f with its rates computed.
func (f *Figures) derive() Figures {
	d := *f
	d.RetrySuccessRate = ratio(float64(f.RetrySuccesses), f.Retries)
	d.LoopRate = ratio(float64(f.ResolvedAttempts), f.Resolved)
	d.CostPerResolved = ratio(f.ResolvedCost, f.Resolved)
	d.TokensPerResolved = ratio(float64(f.ResolvedTokens), f.Resolved)
	d.RepeatCallRate = ratio(float64(f.Refused), f.Attempts)
	if f.Rungs != nil {
		d.Rungs = make(map[string]Rung, len(f.Rungs))
		for k, g := range f.Rungs {
			g.PromptTokensPerAttempt = ratio(float64(g.PromptTokens), g.Prompted)
			d.Rungs[k] = g
		}
	}
	return d
}

func ratio(n float64, d int) *float64 {
	if d == 0 {
		return nil
	}
	v := n / float64(d)
	return &v
}

// RungOrder sorts rung labels the way the ladder climbs them: REFINE,
// PIVOT, RESEARCH, HANDOFF, then any other by name, NoRung last.
func RungOrder(a, b string) int {
	rank := func(s string) int {
		switch s {
		case string(events.RungRefine):
			return 0
		case string(events.RungPivot):
			return 1
		case string(events.RungResearch):
			return 2
		case string(events.RungHandoff):
			return 3
		case NoRung:
			return 5
		}
		return 4
	}
	return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(a, b))
}
