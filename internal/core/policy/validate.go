package policy

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"text/template"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

// Validate reports every problem in the file at once.
func (f *File) Validate() error {
	return errors.Join(f.problems()...)
}

// problems are every problem of the file, in the order a reader meets
// them: the defaults, then each type by name.
func (f *File) problems() []error {
	errs := typeProblems("defaults", f.Defaults)
	errs = append(errs, weightProblems("defaults", f.Defaults)...)
	errs = append(errs, windowProblems("defaults", f.Defaults)...)
	for _, name := range slices.Sorted(maps.Keys(f.Types)) {
		if !events.ValidType(name) {
			errs = append(errs, fmt.Errorf("types: %q is not a task type name (1-%d characters of a-z, 0-9, _ or -: what a task's \"type\" may be)", name, events.MaxTypeLen))
		}
		errs = append(errs, typeProblems("types."+name, f.Types[name])...)
		if t := f.Types[name]; t.OverallWeight != nil || t.RecencyWeight != nil {
			errs = append(errs, weightProblems("types."+name, f.For(name))...)
		}
		if t := f.Types[name]; t.TrustWindow != 0 || t.MinOutcomes != 0 {
			errs = append(errs, windowProblems("types."+name, f.For(name))...)
		}
	}
	return errs
}

// typeProblems are the problems of one entry of the file, the defaults or
// a type's own (not merged), located at where.
func typeProblems(where string, t Type) []error {
	errs := boundProblems(where, t)
	if t.Template != "" {
		if _, err := template.New("prompt").Funcs(TemplateFuncs).Parse(t.Template); err != nil {
			errs = append(errs, fmt.Errorf("%s: template does not parse: %w", where, err))
		}
	}
	errs = append(errs, runProblems(where, t)...)
	errs = append(errs, modelProblems(where, t.Models)...)
	return append(errs, verifierProblems(where, t.Verifier)...)
}

// boundProblems are the numbers of an entry out of their range.
func boundProblems(where string, t Type) []error {
	var errs []error
	if t.MaxRetries < 0 {
		errs = append(errs, fmt.Errorf("%s: max_retries must not be negative", where))
	}
	if t.ToolWait < 0 {
		errs = append(errs, fmt.Errorf("%s: tool_wait must not be negative", where))
	}
	if t.Threshold != nil && (*t.Threshold < 0 || *t.Threshold > 1) {
		errs = append(errs, fmt.Errorf("%s: threshold must be within [0, 1]", where))
	}
	if t.Canary != nil && *t.Canary < 0 {
		errs = append(errs, fmt.Errorf("%s: canary must not be negative", where))
	}
	if t.RungCanary != nil && *t.RungCanary < 0 {
		errs = append(errs, fmt.Errorf("%s: rung_canary must not be negative", where))
	}
	if t.HoldTime < 0 || t.ProbeInterval < 0 {
		errs = append(errs, fmt.Errorf("%s: hold_time and probe_interval must not be negative", where))
	}
	if t.RunAlpha >= 1 {
		errs = append(errs, fmt.Errorf("%s: run_alpha %g must be below 1", where, t.RunAlpha))
	}
	if t.RungFloor != nil && (*t.RungFloor < 0 || *t.RungFloor > 1) {
		errs = append(errs, fmt.Errorf("%s: rung_floor must be within [0, 1]", where))
	}
	if t.RungMinSamples < 0 {
		errs = append(errs, fmt.Errorf("%s: rung_min_samples must not be negative", where))
	}
	if t.TrustWindow < 0 || t.TrustWindow > scoring.MaxWindow {
		errs = append(errs, fmt.Errorf("%s: trust_window must be within [1, %d]", where, scoring.MaxWindow))
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"min_outcomes", t.MinOutcomes}, {"probe_after", t.ProbeAfter}, {"refine_attempts", t.RefineAttempts},
		{"pivot_attempts", t.PivotAttempts}, {"recurring_failures", t.RecurringFailures}, {"previous_attempts", t.PreviousAttempts}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("%s: %s must not be negative", where, n.name))
		}
	}
	if t.RecurringFailures > HistoryKeep {
		errs = append(errs, fmt.Errorf("%s: recurring_failures must be at most %d (the failures a subject's history keeps)", where, HistoryKeep))
	}
	if t.PreviousAttempts > HistoryKeep {
		errs = append(errs, fmt.Errorf("%s: previous_attempts must be at most %d (the outcomes a subject's history keeps)", where, HistoryKeep))
	}
	if t.RecurringWindow < 0 {
		errs = append(errs, fmt.Errorf("%s: recurring_window must not be negative", where))
	}
	for _, w := range []struct {
		name string
		v    *float64
	}{{"overall_weight", t.OverallWeight}, {"recency_weight", t.RecencyWeight}} {
		if w.v != nil && (*w.v < 0 || *w.v > 1) {
			errs = append(errs, fmt.Errorf("%s: %s must be within [0, 1]", where, w.name))
		}
	}
	if d := t.Decay; d != nil && (*d <= 0 || *d > 1) {
		errs = append(errs, fmt.Errorf("%s: decay must be within (0, 1]", where))
	}
	if t.PromptBudget < 0 {
		errs = append(errs, fmt.Errorf("%s: prompt_budget must not be negative", where))
	}
	return errs
}

// runProblems are those of how a task of the entry runs: its simulated
// model, its executor, its tools and its steps.
func runProblems(where string, t Type) []error {
	var errs []error
	if r := t.SimulatedSuccessRate; r != nil && (*r < 0 || *r > 1) {
		errs = append(errs, fmt.Errorf("%s: simulated_success_rate must be within [0, 1]", where))
	}
	if t.CallbackURL != "" {
		if err := events.CheckCallbackURL(t.CallbackURL); err != nil {
			errs = append(errs, fmt.Errorf("%s: callback_url %w", where, err))
		}
	}
	switch t.Executor {
	case "", "model":
	case "command":
		if len(t.Command) == 0 {
			errs = append(errs, fmt.Errorf("%s: executor \"command\" needs a command", where))
		}
	default:
		errs = append(errs, fmt.Errorf("%s: unknown executor %q (model, command)", where, t.Executor))
	}
	for i, tool := range append(append([]Tool(nil), t.Tools...), t.ResearchTools...) {
		if tool.Name == "" || tool.Subject == "" {
			errs = append(errs, fmt.Errorf("%s: tool %d needs a name and a subject", where, i+1))
		}
		if len(tool.Parameters) > 0 && !json.Valid(tool.Parameters) {
			errs = append(errs, fmt.Errorf("%s: tool %s: parameters is not valid JSON", where, tool.Name))
		}
	}
	return append(errs, validateSteps(where, t.Steps)...)
}

// verifierProblems are those of the entry's verifier (nil: none).
func verifierProblems(where string, v *Verifier) []error {
	if v == nil {
		return nil
	}
	var errs []error
	switch v.Kind {
	case "", VerifierNone:
	case VerifierNATS:
		if v.Subject == "" {
			errs = append(errs, fmt.Errorf("%s: nats verifier needs a subject", where))
		}
	case VerifierHTTP:
		if v.URL == "" {
			errs = append(errs, fmt.Errorf("%s: http verifier needs a url", where))
		}
	case VerifierCommand:
		if len(v.Command) == 0 {
			errs = append(errs, fmt.Errorf("%s: command verifier needs a command", where))
		}
	default:
		errs = append(errs, fmt.Errorf("%s: unknown verifier kind %q (none, nats, http, command)", where, v.Kind))
	}
	return errs
}

// weightProblems: overall_weight and recency_weight, as merged, must sum to
// 1 once either is set.
func weightProblems(where string, t Type) []error {
	if t.OverallWeight == nil && t.RecencyWeight == nil {
		return nil
	}
	o, r := scoring.DefaultOverallWeight, scoring.DefaultRecencyWeight
	if t.OverallWeight != nil {
		o = *t.OverallWeight
	}
	if t.RecencyWeight != nil {
		r = *t.RecencyWeight
	}
	if math.Abs(o+r-1) > 1e-9 {
		return []error{fmt.Errorf("%s: overall_weight %g + recency_weight %g must be 1 (set both)", where, o, r)}
	}
	return nil
}

// windowProblems: min_outcomes, as merged, must fit in trust_window.
func windowProblems(where string, t Type) []error {
	w, m := cmp.Or(t.TrustWindow, scoring.DefaultWindow), cmp.Or(t.MinOutcomes, scoring.DefaultMinOutcomes)
	if m > w {
		return []error{fmt.Errorf("%s: min_outcomes %d exceeds trust_window %d: the type could never be gated", where, m, w)}
	}
	return nil
}

func validateSteps(where string, steps []Step) []error {
	var errs []error
	seen := map[string]int{}
	for i, s := range steps {
		at := fmt.Sprintf("%s: step %d", where, i+1)
		switch {
		case s.Name == "":
			errs = append(errs, fmt.Errorf("%s: needs a name", at))
		case seen[s.Name] > 0:
			errs = append(errs, fmt.Errorf("%s: name %q is used twice", at, s.Name))
		}
		seen[s.Name] = i + 1
		switch s.Run {
		case "", "model":
		case "command":
			if len(s.Command) == 0 {
				errs = append(errs, fmt.Errorf("%s (%s): a command step needs a command", at, s.Name))
			}
		default:
			errs = append(errs, fmt.Errorf("%s (%s): run must be model or command, not %q", at, s.Name, s.Run))
		}
		if s.OnFail.Retry != nil && *s.OnFail.Retry < 0 {
			errs = append(errs, fmt.Errorf("%s (%s): retry must not be negative", at, s.Name))
		}
		for _, g := range s.OnFail.Goto {
			if j, ok := seen[g.Step]; !ok || j > i {
				errs = append(errs, fmt.Errorf("%s (%s): goto %q must name an earlier step", at, s.Name, g.Step))
			}
			if g.Max < 0 {
				errs = append(errs, fmt.Errorf("%s (%s): goto max must not be negative", at, s.Name))
			}
		}
		switch s.OnFail.Final {
		case "", "fail", "skip":
		default:
			errs = append(errs, fmt.Errorf("%s (%s): final must be fail or skip, not %q", at, s.Name, s.OnFail.Final))
		}
	}
	return errs
}

// HistoryKeep is how many failures and outcomes of a subject the history
// keeps (history.Keep): recurring_failures and previous_attempts ask for
// at most that many.
const HistoryKeep = 5
