package policy

import (
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

// Names reports whether the policy has an entry of its own for taskType
// (under "types", even an empty one), rather than giving it the defaults
// as it gives any type. Intake may refuse a type the policy does not name
// (DISPATCH_KNOWN_TYPES_ONLY); a named type always has metric labels of
// its own (services.LabelSet).
func (f *File) Names(taskType string) bool {
	if f == nil {
		return false
	}
	_, ok := f.Types[taskType]
	return ok
}

// For returns the merged policy of a task type.
func (f *File) For(taskType string) Type {
	if f == nil {
		return Type{}.withDefaults(taskType)
	}
	t := f.Types[taskType]
	d := f.Defaults
	ownModel := t.Model
	if t.Executor == "" { // the defaults' executor comes with its command
		t.Executor, t.Command = d.Executor, d.Command
	}
	fill(&t.Model, d.Model)
	fill(&t.Template, d.Template)
	fill(&t.Verifier, d.Verifier)
	fill(&t.MaxRetries, d.MaxRetries)
	if t.Exempt == nil && d.Exempt != nil && *d.Exempt {
		// The defaults may exempt every type, never take the built-in
		// exemptions away: a false there is every other type's default
		// already. Only a type's own "exempt": false gates a self-repair type.
		t.Exempt = d.Exempt
	}
	fill(&t.Threshold, d.Threshold)
	fill(&t.Canary, d.Canary)
	fill(&t.HoldTime, d.HoldTime)
	fill(&t.ProbeInterval, d.ProbeInterval)
	fill(&t.PriorWeight, d.PriorWeight)
	fill(&t.RunAlpha, d.RunAlpha)
	fill(&t.RungFloor, d.RungFloor)
	fill(&t.RungMinSamples, d.RungMinSamples)
	fill(&t.RungCanary, d.RungCanary)
	fill(&t.TrustWindow, d.TrustWindow)
	fill(&t.MinOutcomes, d.MinOutcomes)
	fill(&t.ProbeAfter, d.ProbeAfter)
	fill(&t.OverallWeight, d.OverallWeight)
	fill(&t.RecencyWeight, d.RecencyWeight)
	fill(&t.Decay, d.Decay)
	fill(&t.RefineAttempts, d.RefineAttempts)
	fill(&t.PivotAttempts, d.PivotAttempts)
	fill(&t.RecurringFailures, d.RecurringFailures)
	fill(&t.RecurringWindow, d.RecurringWindow)
	fill(&t.PreviousAttempts, d.PreviousAttempts)
	fill(&t.PromptBudget, d.PromptBudget)
	fill(&t.SimulatedSuccessRate, d.SimulatedSuccessRate)
	fill(&t.CommandTimeout, d.CommandTimeout)
	fill(&t.MaxToolCalls, d.MaxToolCalls)
	fill(&t.TransientBudget, d.TransientBudget)
	fill(&t.ToolWait, d.ToolWait)
	fill(&t.Budget, d.Budget)
	fill(&t.DailyBudget, d.DailyBudget)
	fill(&t.SkipBudget, d.SkipBudget)
	fill(&t.SkipDelay, d.SkipDelay)
	fill(&t.CallbackURL, d.CallbackURL)
	if len(t.Command) == 0 {
		t.Command = d.Command
	}
	if t.Models == nil && ownModel == "" {
		// a type naming its own model does not take the defaults' chain
		t.Models = d.Models
	}
	if t.Tools == nil {
		t.Tools = d.Tools
	}
	if t.ResearchTools == nil {
		t.ResearchTools = d.ResearchTools
	}
	if t.Steps == nil {
		t.Steps = d.Steps
	}
	return t.withDefaults(taskType)
}

// fill sets *field to def when the type left it unset (its zero value).
func fill[T comparable](field *T, def T) {
	var zero T
	if *field == zero {
		*field = def
	}
}

func (t Type) withDefaults(taskType string) Type {
	if t.MaxRetries == 0 {
		t.MaxRetries = DefaultMaxRetries
	}
	if t.Exempt == nil {
		exempt := false
		for _, e := range DefaultExempt {
			exempt = exempt || e == taskType
		}
		t.Exempt = &exempt
	}
	if t.Verifier == nil {
		t.Verifier = &Verifier{Kind: VerifierNone}
	}
	return t
}

// Scoring returns the trust scoring and gating policy p with this type's
// overrides: threshold (an explicit 0 never gates), canary (0: no canaries),
// rung_floor (0: never hand off for it), rung_min_samples and rung_canary
// (0: every retry climbs at once).
func (t Type) Scoring(p scoring.Policy) scoring.Policy {
	if t.Threshold != nil {
		p.Threshold = *t.Threshold
		if p.Threshold == 0 {
			p.Threshold = -1
		}
	}
	if t.Canary != nil {
		p.Canary = *t.Canary
		if p.Canary == 0 {
			p.Canary = -1
		}
	}
	if t.RungFloor != nil {
		p.RungFloor = *t.RungFloor
		if p.RungFloor == 0 {
			p.RungFloor = -1
		}
	}
	if t.RungMinSamples > 0 {
		p.RungMinSamples = t.RungMinSamples
	}
	if t.RungCanary != nil {
		p.RungCanary = *t.RungCanary
		if p.RungCanary == 0 {
			p.RungCanary = -1
		}
	}
	if t.HoldTime > 0 {
		p.HoldTime = time.Duration(t.HoldTime)
	}
	if t.ProbeInterval > 0 {
		p.ProbeInterval = time.Duration(t.ProbeInterval)
	}
	if t.PriorWeight != 0 {
		p.PriorWeight = t.PriorWeight
	}
	if t.RunAlpha != 0 {
		p.RunAlpha = t.RunAlpha
	}
	if t.TrustWindow > 0 {
		p.Window = t.TrustWindow
	}
	if t.MinOutcomes > 0 {
		p.MinOutcomes = t.MinOutcomes
	}
	if t.ProbeAfter > 0 {
		p.ProbeAfter = t.ProbeAfter
	}
	if t.OverallWeight != nil || t.RecencyWeight != nil { // both, as validated: they sum to 1
		p.OverallWeight, p.RecencyWeight = scoring.DefaultOverallWeight, scoring.DefaultRecencyWeight
		if t.OverallWeight != nil {
			p.OverallWeight = *t.OverallWeight
		}
		if t.RecencyWeight != nil {
			p.RecencyWeight = *t.RecencyWeight
		}
	}
	if t.Decay != nil {
		p.Decay = *t.Decay
	}
	return p
}

// Verifies reports whether the type has a verifier: without one a pass has
// nothing to verify and goes to the gate at once (task.Unverified).
func (t Type) Verifies() bool {
	return t.Verifier != nil && t.Verifier.Kind != "" && t.Verifier.Kind != VerifierNone
}

// IsExempt reports whether the gate lets every task of this type past
// trust (its daily budget and rung floor still apply).
func (t Type) IsExempt() bool { return t.Exempt != nil && *t.Exempt }

// SuccessRate is the simulated model's success rate (default 1).
func (t Type) SuccessRate() float64 {
	if t.SimulatedSuccessRate == nil {
		return 1
	}
	return *t.SimulatedSuccessRate
}
