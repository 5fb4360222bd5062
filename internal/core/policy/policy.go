// Package policy holds the per-task-type policies read from the policy file
// (DISPATCH_POLICY_FILE, JSON) and reloaded while the mesh runs.
//
//	{
//	  "defaults": {"model": "gpt-4o-mini", "max_retries": 3},
//	  "types": {
//	    "css_fix": {
//	      "model": "gpt-4o",
//	      "verifier": {"kind": "command", "command": ["./still-broken.sh"], "timeout": "10s"},
//	      "simulated_success_rate": 0.05
//	    }
//	  }
//	}
//
// A type's policy is its entry merged over "defaults"; a field left out takes
// the default's value.
package policy

import (
	"encoding/json"
	"fmt"
	"text/template"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

// TemplateFuncs are the functions a prompt template may call, as the
// policy checks a template: their names, with stand-ins for the prompt
// builder's (services/prompt, whose test keeps the two in step).
var TemplateFuncs = template.FuncMap{"xml": func(any) (string, error) { return "", nil }}

// Verifier kinds.
const (
	VerifierNone    = "none"
	VerifierNATS    = "nats"
	VerifierHTTP    = "http"
	VerifierCommand = "command"
)

// Duration is a time.Duration written as a Go duration string ("10s") in JSON.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Verifier says how to check that a task's problem still exists.
type Verifier struct {
	// Kind is none (default), nats, http or command.
	Kind string `json:"kind"`
	// Subject is the NATS request-reply subject (kind nats). The request is the
	// task JSON; the reply is {"exists": bool, "detail": "..."}.
	Subject string `json:"subject,omitempty"`
	// URL is the HTTP endpoint (kind http). The task JSON is POSTed; 2xx means
	// the problem exists, 404 or 410 mean it is gone, anything else is an error.
	URL string `json:"url,omitempty"`
	// Command is the argv to run (kind command), with the task JSON on stdin:
	// exit 0 means the problem exists, exit 1 means it is gone, anything else
	// is an error.
	Command []string `json:"command,omitempty"`
	// Timeout bounds one check. Default 10s.
	Timeout Duration `json:"timeout,omitempty"`
	// FailClosed cancels the task when the verifier errors or times out.
	// Default false: the error is recorded and the task goes on (fail-open).
	FailClosed bool `json:"fail_closed,omitempty"`
}

// Type is the policy of one task type. Pointer fields distinguish "not set"
// (take the default) from an explicit zero.
type Type struct {
	// Model is the model name sent to the OpenAI-compatible endpoint.
	// Default: DISPATCH_MODEL.
	Model string `json:"model,omitempty"`
	// Models is the type's model chain, tried in order (see Model): a
	// model cooling down or misconfigured passes the call to the next one
	// without counting an attempt. When set, it replaces Model. Default:
	// none, the one model Model names.
	Models []Model `json:"models,omitempty"`
	// Template is an inline Go text/template for the user prompt.
	Template string `json:"template,omitempty"`
	// TemplateFile is a file holding the template (read at load time).
	TemplateFile string `json:"template_file,omitempty"`
	// Verifier checks staleness before every attempt. Default: none.
	Verifier *Verifier `json:"verifier,omitempty"`
	// MaxRetries is the attempt at which the escalation ladder hands the
	// task to a human (HANDOFF). Default 7. A task's own max_retries may
	// lower it, never raise it.
	MaxRetries int `json:"max_retries,omitempty"`
	// Exempt types are never gated by trust, nor held back as canaries;
	// the daily budget and the rung floor still apply to them (SPEC §4).
	// Default: triage_fix, security_fix and service_restart are exempt. In
	// the defaults, true exempts every type and false changes nothing: a
	// self-repair type is gated only by its own "exempt": false.
	Exempt *bool `json:"exempt,omitempty"`
	// Threshold is the trust score below which the type is gated. Default 0.15.
	Threshold *float64 `json:"threshold,omitempty"`
	// Canary is how many tasks of the type may be in flight at once while
	// it has too few settled tasks to be scored (fewer than min_outcomes):
	// a burst of a new type sends one round of canaries and the rest wait,
	// unspent, for their results. Default: min_outcomes, or fewer when the
	// mesh's pooled evidence decides a new type sooner (scoring.Prior.Sample);
	// 0 lets every pass go at once.
	Canary *int `json:"canary,omitempty"`
	// HoldTime is how long a task held for its type's low trust waits to
	// be re-admitted before it goes to a human. Default 24h.
	HoldTime Duration `json:"hold_time,omitempty"`
	// ProbeInterval is the least time between two probes taken from the
	// type's held tasks, doubling per probe that fails in a row (at most
	// 1h). Default 10s.
	ProbeInterval Duration `json:"probe_interval,omitempty"`
	// PriorWeight is how many of the type's own tasks the mesh's pooled
	// evidence counts for while the type has fewer than min_outcomes
	// settled tasks. Default 0: fitted from how alike the types are;
	// negative: no pooling.
	PriorWeight float64 `json:"prior_weight,omitempty"`
	// RunAlpha: the type is held when its newest tasks failed in a run
	// less likely than run_alpha at its success rate before (a
	// regression). Default 0.001; negative: never.
	RunAlpha float64 `json:"run_alpha,omitempty"`
	// RungFloor is the share of the type's retries on a rung that must
	// succeed for a task to climb onto that rung, once RungMinSamples of them
	// are in the trust window; below it the task goes to a human (HANDOFF)
	// instead of paying for the retry. Default 0.25; 0 never hands off for it.
	RungFloor *float64 `json:"rung_floor,omitempty"`
	// RungMinSamples is how many retries on a rung must be measured before
	// RungFloor applies. Default 8.
	RungMinSamples int `json:"rung_min_samples,omitempty"`
	// RungCanary: while the type has fewer than rung_canary retries
	// measured on a rung (or, under a rung floor, fewer than
	// rung_min_samples, none of them a success), at most that many climb
	// onto it at once; the others wait (status unchanged, no tokens) for
	// their outcomes, at most the canary TTL (10m). Default 1; 0 lets
	// every retry climb at once.
	RungCanary *int `json:"rung_canary,omitempty"`
	// TrustWindow is how many of the type's newest outcomes are scored.
	// Default 50, at most scoring.MaxWindow (100).
	TrustWindow int `json:"trust_window,omitempty"`
	// MinOutcomes is how many outcomes the window must hold before the type
	// is gated (fewer: it is not scored yet, its passes go as canaries).
	// Default 10.
	MinOutcomes int `json:"min_outcomes,omitempty"`
	// ProbeAfter is how many consecutive blocks of the type let the next
	// task through as a probe that re-measures it. Default 5.
	ProbeAfter int `json:"probe_after,omitempty"`
	// OverallWeight and RecencyWeight weigh the plain and the
	// recency-weighted success rate in the score; together they must be 1.
	// Defaults 0.6 and 0.4.
	OverallWeight *float64 `json:"overall_weight,omitempty"`
	RecencyWeight *float64 `json:"recency_weight,omitempty"`
	// Decay sets the recency weights: the i-th newest outcome weighs
	// decay^i, within (0, 1]. Default 0.9.
	Decay *float64 `json:"decay,omitempty"`
	// RefineAttempts and PivotAttempts are how many failed attempts the
	// REFINE and PIVOT rungs get before the next rung. Defaults 2 and 2.
	RefineAttempts int `json:"refine_attempts,omitempty"`
	PivotAttempts  int `json:"pivot_attempts,omitempty"`
	// RecurringFailures failures of a subject within RecurringWindow make
	// its next task start on PIVOT. Defaults 3 (at most the 5 failures a
	// subject's history keeps) and 168h.
	RecurringFailures int      `json:"recurring_failures,omitempty"`
	RecurringWindow   Duration `json:"recurring_window,omitempty"`
	// PreviousAttempts is how many of the subject's last outcomes the prompt
	// shows in <previous_attempts>. Default 5, at most the 5 its history
	// keeps.
	PreviousAttempts int `json:"previous_attempts,omitempty"`
	// PromptBudget bounds, in tokens (≈ characters / 4), what the prompt
	// builder injects: previous attempts, dead ends, the last error and a
	// reviewer's note. Default 300.
	PromptBudget int `json:"prompt_budget,omitempty"`
	// Executor is "model" (default: an OpenAI-compatible chat completion) or
	// "command" (an agent CLI: Command run with the prompt on stdin).
	Executor string `json:"executor,omitempty"`
	// Command is the agent CLI argv when Executor is "command".
	Command []string `json:"command,omitempty"`
	// CommandTimeout bounds one command run. Default 10m. A timeout
	// short-circuits the task to a human.
	CommandTimeout Duration `json:"command_timeout,omitempty"`
	// Tools the model may call (OpenAI function calling); each is a NATS
	// request-reply endpoint, e.g. a micro service written in any language.
	Tools []Tool `json:"tools,omitempty"`
	// ResearchTools are offered on the RESEARCH rung only, for that attempt.
	ResearchTools []Tool `json:"research_tools,omitempty"`
	// MaxToolCalls bounds the tool loop of one attempt. Default 8.
	MaxToolCalls int `json:"max_tool_calls,omitempty"`
	// TransientBudget is how many transient failures a task rides out before
	// its attempt fails with "provider unavailable". Default 8.
	TransientBudget int `json:"transient_budget,omitempty"`
	// ToolWait bounds how long an attempt waits for a tool that does not
	// answer (no responders, a timeout, a tool's 5xx), counted from the
	// first time one did not: meanwhile the task is snoozed — no model call,
	// not an attempt — and resumes where it stopped once the tool answers;
	// past it the task goes to a human (error class tool_unavailable). The
	// snoozes grow with the wait, so any wait takes about 60 deliveries at
	// most. Default 10m.
	ToolWait Duration `json:"tool_wait,omitempty"`
	// Budget caps what one task may spend; past it the task goes to a human.
	// Default: no cap.
	Budget *Budget `json:"budget,omitempty"`
	// DailyBudget caps what the type may spend per UTC day; past it the gate
	// blocks the type's tasks with reason "budget". Default: no cap.
	DailyBudget *Budget `json:"daily_budget,omitempty"`
	// Steps make the type a pipeline (SPEC §7); without them a task is one
	// step, "execute".
	Steps []Step `json:"steps,omitempty"`
	// SkipBudget is how often a pipeline task that exhausted its loops with
	// final "skip" is parked and re-queued before it is flagged stuck.
	// Default 2.
	SkipBudget int `json:"skip_budget,omitempty"`
	// SkipDelay is how long a skipped task stays parked. Default 10m.
	SkipDelay Duration `json:"skip_delay,omitempty"`
	// SimulatedSuccessRate is the share of attempts the built-in simulated
	// model (used when no API key is configured) reports as successes.
	// Default 1. Decided deterministically from the task id and attempt.
	SimulatedSuccessRate *float64 `json:"simulated_success_rate,omitempty"`
	// CallbackURL is where the webhook service POSTs the wait answer of a
	// task of the type that settles without a callback_url of its own
	// (docs/api.md#webhooks): the policy in force when it settles decides.
	// Default none.
	CallbackURL string `json:"callback_url,omitempty"`
}

// Budget is a spending cap in tokens (input + output) and/or USD; zero
// fields do not cap.
type Budget struct {
	Tokens int     `json:"tokens,omitempty"`
	Cost   float64 `json:"cost,omitempty"`
}

// Exceeded reports whether tokens or cost is past the cap.
func (b *Budget) Exceeded(tokens int, cost float64) bool {
	return b != nil && ((b.Tokens > 0 && tokens > b.Tokens) || (b.Cost > 0 && cost > b.Cost))
}

// Tool is a function the model may call, served over NATS request-reply:
// the request body is the call's JSON arguments, the reply its result. An
// error reply carries the micro error headers (Nats-Service-Error-Code such
// as 400, Nats-Service-Error) and a body the model sees in full.
type Tool struct {
	// Name is the function name the model sees.
	Name string `json:"name"`
	// Subject is the NATS subject the call is requested on.
	Subject     string `json:"subject"`
	Description string `json:"description,omitempty"`
	// Parameters is the JSON Schema of the arguments.
	Parameters json.RawMessage `json:"parameters,omitempty"`
	// Timeout bounds one call. Default 30s.
	Timeout Duration `json:"timeout,omitempty"`
}

// Step is one step of a pipeline.
type Step struct {
	// Name identifies the step (goto targets name it).
	Name string `json:"name"`
	// Run is "model" (default) or "command".
	Run string `json:"run,omitempty"`
	// Command is the argv of a command step (e.g. ["go", "vet", "./..."]),
	// run in Dir with the task JSON on stdin; exit 0 passes.
	Command []string `json:"command,omitempty"`
	Dir     string   `json:"dir,omitempty"`
	// Timeout bounds a command step. Default 10m. A step that times out
	// follows its on_fail like any failed step.
	Timeout Duration `json:"timeout,omitempty"`
	// OnFail says what a failure leads to.
	OnFail OnFail `json:"on_fail"`
}

// OnFail is a step's failure policy: retry the step, then go back to earlier
// steps in order (each edge at most Max times), then Final.
type OnFail struct {
	// Retry is how often the step itself is retried. Default 3 for model
	// steps, 0 for command steps (a deterministic check gives the same answer).
	Retry *int `json:"retry,omitempty"`
	// Goto lists the steps to go back to, nearest first (nested fallbacks).
	Goto []Goto `json:"goto,omitempty"`
	// Final is "fail" (default: the task goes to a human) or "skip" (park
	// the task and bring it back later, up to the skip budget).
	Final string `json:"final,omitempty"`
}

// Goto is one go-back edge.
type Goto struct {
	Step string `json:"step"`
	// Max is how often this edge may be taken. Default 3.
	Max int `json:"max,omitempty"`
}

// File is the policy file.
type File struct {
	Defaults Type            `json:"defaults"`
	Types    map[string]Type `json:"types"`
}

// DefaultMaxRetries applies when neither the task nor its policy sets one:
// the attempt at which the escalation ladder hands off to a human.
const DefaultMaxRetries = 7

// DefaultExempt are the self-repair types the gate never blocks for trust
// (Type.Exempt): scoring.DefaultExempt, the one list.
var DefaultExempt = scoring.DefaultExempt()
