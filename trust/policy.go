package trust

import (
	"errors"
	"fmt"
	"slices"
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
	// for a score in [0, 1].
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
	if p.OverallWeight == 0 {
		p.OverallWeight = DefaultOverallWeight
	}
	if p.RecencyWeight == 0 {
		p.RecencyWeight = DefaultRecencyWeight
	}
	if p.Decay == 0 {
		p.Decay = DefaultDecay
	}
	if p.ProbeAfter == 0 {
		p.ProbeAfter = DefaultProbeAfter
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
	if p.Window < 1 {
		errs = append(errs, fmt.Errorf("trust: window %d must be positive", p.Window))
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
	return errors.Join(errs...)
}

// Exempted reports whether taskType is never gated under p.
func (p Policy) Exempted(taskType string) bool {
	if p.Exempt == nil {
		return slices.Contains(DefaultExempt(), taskType)
	}
	return slices.Contains(p.Exempt, taskType)
}
