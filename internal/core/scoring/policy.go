package scoring

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Default policy values (SPEC §4).
const (
	DefaultWindow        = 50
	DefaultMinOutcomes   = 10
	DefaultThreshold     = 0.15
	DefaultOverallWeight = 0.6
	DefaultRecencyWeight = 0.4
	DefaultDecay         = 0.9
	DefaultProbeAfter    = 5
	// DefaultCanary is how many tasks of a type with fewer than MinOutcomes
	// settled tasks may be in flight at once, 0 meaning MinOutcomes: one
	// round of canaries reaches the scoring sample; the rest wait for it.
	DefaultCanary = 0
	// DefaultCanaryTTL is how long a canary holds its place without an
	// outcome (a lost or very slow pass), and how long a task waits for one.
	DefaultCanaryTTL = 10 * time.Minute
	// DefaultRungFloor and DefaultRungMinSamples: once a rung has
	// DefaultRungMinSamples retries of a type in the window, a retry on it
	// must succeed at least DefaultRungFloor of the time to be made; below
	// that the task goes to a human instead.
	DefaultRungFloor      = 0.25
	DefaultRungMinSamples = 8
	// DefaultRungExplore: at most one retry in 5 climbs a rung that only
	// the pooled evidence (not yet the type's own) advises against, fewer
	// as that evidence grows (ExploreShare).
	DefaultRungExplore = 5
	// DefaultRungCanary: while a type has no retry measured on a rung (or,
	// under a rung floor, only failed ones, fewer than RungMinSamples), one
	// of its retries climbs onto it and the others wait for its outcome.
	DefaultRungCanary = 1
	// DefaultHoldTime is how long a task the gate holds for low trust
	// waits to be re-admitted before it goes to a human.
	DefaultHoldTime = 24 * time.Hour
	// DefaultProbeInterval is the least time between two probes taken from
	// a type's held tasks; it doubles with each probe that fails in a row,
	// up to MaxProbeInterval.
	DefaultProbeInterval = 10 * time.Second
	// DefaultRunAlpha: a run of failed tasks less likely than 1 in 1,000
	// at the type's own rate before it stops the type (a regression): a
	// type that always succeeded stops after two failed tasks, a 95 % one
	// after three, a 50 % one after ten.
	DefaultRunAlpha  = 0.001
	MaxProbeInterval = time.Hour
)

// DefaultExempt lists the task types that are never gated unless
// Policy.Exempt says otherwise.
func DefaultExempt() []string {
	return []string{"triage_fix", "security_fix", "service_restart"}
}

// Policy configures trust scoring and gating. The zero value is the SPEC
// policy: every zero field means its default (see WithDefaults).
type Policy struct {
	// Window is how many of the newest outcomes are scored and kept per type.
	// Default 50.
	Window int
	// MinOutcomes is the number of outcomes in the window below which a type
	// is never gated. Default 10.
	MinOutcomes int
	// Threshold is the score below which a type is gated. Default 0.15. Zero
	// means the default; a negative threshold never gates (scores are ≥ 0).
	Threshold float64
	// OverallWeight weighs the plain success rate over the window. Default 0.6.
	OverallWeight float64
	// RecencyWeight weighs the recency-weighted success rate. Default 0.4.
	// The weights are not normalised: keep OverallWeight+RecencyWeight at 1
	// for a score in [0, 1]. They take their defaults only when both are
	// zero: one of them set makes the other's zero a weight of 0.
	RecencyWeight float64
	// Decay sets the recency weights: the i-th newest outcome (i = 0 for the
	// newest) weighs Decay^i. Default 0.9, with which the newest 10 outcomes
	// carry about 65% of the weight over a 50-outcome window and the oldest
	// (weight 0.9^49 ≈ 0.006) almost none. 1 weighs all outcomes equally.
	Decay float64
	// ProbeAfter is the number of consecutive blocks of a type after which
	// the next task of that type is let through as a probe to re-measure it.
	// Default 5.
	ProbeAfter int
	// Canary is how many tasks of a type with fewer than MinOutcomes
	// settled tasks in its window may be in flight (admitted, not ended) at
	// once: a burst of a new type sends one round of canaries and the rest
	// wait, unspent, until the canaries' results can score the type.
	// Default MinOutcomes; negative admits every pass at once.
	Canary int
	// CanaryTTL is how long an admitted canary holds its place without an
	// outcome, and how long a pass waits for a place before it goes anyway.
	// Default 10m.
	CanaryTTL time.Duration
	// RungFloor is the share of retries on a rung that must succeed for the
	// gate to let a retry climb onto it, once RungMinSamples retries on that
	// rung are in the window; below it the task is handed to a human now.
	// Default 0.25; negative never hands off for it.
	RungFloor float64
	// RungMinSamples is how many retries on a rung the window must hold
	// before RungFloor applies. Default 8.
	RungMinSamples int
	// RungExplore: at most one retry in RungExplore (a hash of the pass)
	// climbs a rung below the floor on pooled evidence, so the pool keeps
	// measuring it — fewer as the evidence grows (ExploreShare); 1 leaves
	// the share uncapped. Default 5; negative never.
	RungExplore int
	// RungCanary: while the type's window holds too few of its retries on
	// a rung to judge it (RungThin: fewer than RungCanary, or fewer than
	// RungMinSamples and none a success), at most RungCanary of them run
	// on that rung at once and the others wait for their outcomes (each at
	// most CanaryTTL), so a burst of failures measures a rung before it
	// pays for it many times over. Default 1; negative lets every retry
	// climb at once.
	RungCanary int
	// PriorWeight is how many of a type's own tasks the mesh's pooled
	// evidence counts for while the type has fewer than MinOutcomes
	// settled tasks. 0 (default): fitted from how alike the types are
	// (Pool.Prior); negative: no pooling, a new type is never gated before
	// MinOutcomes.
	PriorWeight float64
	// RunAlpha: the type is below when its newest settled tasks failed in
	// a run less likely than RunAlpha at its success rate before the run
	// (a regression, seen in a few tasks). Default 0.001; negative never.
	RunAlpha float64
	// HoldTime is how long a task held for low trust waits to be
	// re-admitted before it goes to a human. Default 24h.
	HoldTime time.Duration
	// ProbeInterval is the least time between two probes taken from a
	// type's held tasks (doubling per failed probe in a row). Default 10s.
	ProbeInterval time.Duration
	// Exempt lists task types that are never gated. Default triage_fix,
	// security_fix and service_restart: nil means the defaults, an explicit
	// empty slice means no exempt types.
	Exempt []string
}

// WithDefaults returns p with every zero field set to its default.
func (p Policy) WithDefaults() Policy {
	if p.Window == 0 {
		p.Window = DefaultWindow
	}
	if p.MinOutcomes == 0 {
		p.MinOutcomes = DefaultMinOutcomes
	}
	if p.Threshold == 0 {
		p.Threshold = DefaultThreshold
	}
	if p.OverallWeight == 0 && p.RecencyWeight == 0 {
		p.OverallWeight, p.RecencyWeight = DefaultOverallWeight, DefaultRecencyWeight
	}
	if p.Decay == 0 {
		p.Decay = DefaultDecay
	}
	if p.ProbeAfter == 0 {
		p.ProbeAfter = DefaultProbeAfter
	}
	if p.Canary == 0 {
		p.Canary = p.MinOutcomes
	}
	if p.CanaryTTL == 0 {
		p.CanaryTTL = DefaultCanaryTTL
	}
	if p.RungFloor == 0 {
		p.RungFloor = DefaultRungFloor
	}
	if p.RungMinSamples == 0 {
		p.RungMinSamples = DefaultRungMinSamples
	}
	if p.RungExplore == 0 {
		p.RungExplore = DefaultRungExplore
	}
	if p.RungCanary == 0 {
		p.RungCanary = DefaultRungCanary
	}
	if p.HoldTime == 0 {
		p.HoldTime = DefaultHoldTime
	}
	if p.RunAlpha == 0 {
		p.RunAlpha = DefaultRunAlpha
	}
	if p.ProbeInterval == 0 {
		p.ProbeInterval = DefaultProbeInterval
	}
	if p.Exempt == nil {
		p.Exempt = DefaultExempt()
	} else {
		p.Exempt = slices.Clone(p.Exempt)
	}
	return p
}

// Validate reports every problem with p (after defaults), joined.
func (p Policy) Validate() error {
	p = p.WithDefaults()
	var errs []error
	if p.Window < 1 || p.Window > MaxWindow {
		errs = append(errs, fmt.Errorf("trust: window %d must be 1-%d (the outcome stream keeps %d per type)", p.Window, MaxWindow, Keep))
	}
	if p.MinOutcomes < 0 {
		errs = append(errs, fmt.Errorf("trust: min outcomes %d must not be negative", p.MinOutcomes))
	}
	if p.Threshold > 1 {
		errs = append(errs, fmt.Errorf("trust: threshold %g must be at most 1", p.Threshold))
	}
	if p.OverallWeight < 0 || p.RecencyWeight < 0 {
		errs = append(errs, fmt.Errorf("trust: weights %g and %g must not be negative", p.OverallWeight, p.RecencyWeight))
	}
	if p.Decay < 0 || p.Decay > 1 {
		errs = append(errs, fmt.Errorf("trust: decay %g must be in (0, 1]", p.Decay))
	}
	if p.ProbeAfter < 1 {
		errs = append(errs, fmt.Errorf("trust: probe after %d must be positive", p.ProbeAfter))
	}
	if p.CanaryTTL < 0 {
		errs = append(errs, fmt.Errorf("trust: canary TTL %s must not be negative", p.CanaryTTL))
	}
	if p.RungFloor > 1 {
		errs = append(errs, fmt.Errorf("trust: rung floor %g must be at most 1", p.RungFloor))
	}
	if p.HoldTime < 0 || p.ProbeInterval < 0 {
		errs = append(errs, fmt.Errorf("trust: hold time %s and probe interval %s must not be negative", p.HoldTime, p.ProbeInterval))
	}
	if p.RungMinSamples < 0 {
		errs = append(errs, fmt.Errorf("trust: rung min samples %d must not be negative", p.RungMinSamples))
	}
	return errors.Join(errs...)
}

// Exempted reports whether taskType is never gated under p.
func (p Policy) Exempted(taskType string) bool {
	if p.Exempt == nil {
		return slices.Contains(DefaultExempt(), taskType)
	}
	return slices.Contains(p.Exempt, taskType)
}
