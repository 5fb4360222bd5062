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
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/trust"
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
	// mesh's pooled evidence decides a new type sooner (trust.Prior.Sample);
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
	// TrustWindow is how many of the type's newest outcomes are scored.
	// Default 50, at most trust.MaxWindow (100).
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
// (Type.Exempt).
var DefaultExempt = []string{"triage_fix", "security_fix", "service_restart"}

// Parse reads a policy file's bytes and validates them. It reports every
// problem at once: unknown fields (anywhere), values of the wrong type,
// type names that are not task types, and what Validate finds.
func Parse(data []byte) (*File, error) {
	f, errs := parse(data)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return f, nil
}

// parse decodes and validates a policy file, collecting every problem. The
// file it returns holds what decoded — every field but those with a value
// of the wrong type, which Validate then checks too — even when there are
// problems; nil when the bytes are not a JSON object.
func parse(data []byte) (*File, []error) {
	// The first JSON value, as a decoder reads it (trailing bytes are not
	// read, as before).
	var doc json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		return nil, []error{fmt.Errorf("policy: %w", err)}
	}
	var top struct {
		Defaults json.RawMessage            `json:"defaults"`
		Types    map[string]json.RawMessage `json:"types"`
	}
	if err := json.Unmarshal(doc, &top); err != nil {
		return nil, located("policy", []error{describeDecode(err)})
	}
	var generic any
	_ = json.Unmarshal(doc, &generic) // it decoded above
	errs := unknownFields(reflect.TypeFor[File](), generic, "")

	f := &File{}
	if top.Types != nil {
		f.Types = make(map[string]Type, len(top.Types))
	}
	if len(top.Defaults) > 0 && string(top.Defaults) != "null" {
		errs = append(errs, located("defaults", decodeType(top.Defaults, &f.Defaults))...)
	}
	for _, name := range slices.Sorted(maps.Keys(top.Types)) {
		var t Type
		if raw := top.Types[name]; string(raw) != "null" {
			errs = append(errs, located("types."+name, decodeType(raw, &t))...)
		}
		f.Types[name] = t
	}
	return f, append(errs, f.problems()...)
}

// decodeType decodes one type's policy. A value of the wrong type stops
// the decoder at the first, so on failure every field is decoded on its
// own to report each problem, and t holds the fields that decode (for
// Validate to check them too).
func decodeType(raw json.RawMessage, t *Type) []error {
	err := json.Unmarshal(raw, t)
	if err == nil {
		return nil
	}
	*t = Type{}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return []error{describeDecode(err)}
	}
	var errs []error
	good := map[string]json.RawMessage{}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		one, _ := json.Marshal(map[string]json.RawMessage{k: fields[k]})
		var scratch Type
		if err := json.Unmarshal(one, &scratch); err != nil {
			errs = append(errs, describeDecode(err)) // names its field
			continue
		}
		good[k] = fields[k]
	}
	if len(errs) == 0 {
		return []error{describeDecode(err)}
	}
	rest, _ := json.Marshal(good)
	_ = json.Unmarshal(rest, t) // each decoded on its own
	return errs
}

// describeDecode drops what a decode error says about Go (struct and field
// names) where it can say it in the file's terms: the path of the field
// (JSON names, dotted), then what was found where what was expected.
func describeDecode(err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err
	}
	what := fmt.Errorf("a JSON %s where %s is expected", te.Value, jsonKind(te.Type))
	if te.Field != "" {
		return fmt.Errorf("%s: %w", te.Field, what)
	}
	return what
}

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}

func located(where string, errs []error) []error {
	out := make([]error, len(errs))
	for i, err := range errs {
		out[i] = fmt.Errorf("%s: %w", where, err)
	}
	return out
}

var (
	rawMessageType  = reflect.TypeFor[json.RawMessage]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// unknownFields lists every key of v (a decoded JSON value) that the Go
// type t has no field for, at any depth, as the decoder matches keys
// (exactly, else case-insensitively). path locates v ("": the top).
func unknownFields(t reflect.Type, v any, path string) []error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType || reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil // any JSON (parameters), or decoded by its own rules (durations)
	}
	at := func(sub string) string {
		if path == "" {
			return sub
		}
		return path + "." + sub
	}
	var errs []error
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil // a value of the wrong type: the decoder reports it
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			f, ok := jsonField(t, k)
			if !ok {
				where := "policy"
				if path != "" {
					where = path
				}
				errs = append(errs, fmt.Errorf("%s: unknown field %q", where, k))
				continue
			}
			errs = append(errs, unknownFields(f.Type, obj[k], at(jsonName(f)))...)
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			errs = append(errs, unknownFields(t.Elem(), obj[k], at(k))...)
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, e := range arr {
			errs = append(errs, unknownFields(t.Elem(), e, fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	return errs
}

// jsonField finds the field of struct t that the decoder fills from key k.
func jsonField(t reflect.Type, k string) (reflect.StructField, bool) {
	var fold *reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Tag.Get("json") == "-" {
			continue
		}
		name := jsonName(f)
		if name == k {
			return f, true
		}
		if fold == nil && strings.EqualFold(name, k) {
			fold = &f
		}
	}
	if fold != nil {
		return *fold, true
	}
	return reflect.StructField{}, false
}

func jsonName(f reflect.StructField) string {
	if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
		return name
	}
	return f.Name
}

// Load reads and parses a policy file; template files are read relative to
// the working directory.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := f.readTemplates(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

func (f *File) readTemplates() error {
	read := func(t *Type) error {
		if t.TemplateFile == "" {
			return nil
		}
		b, err := os.ReadFile(t.TemplateFile)
		if err != nil {
			return err
		}
		t.Template = string(b)
		return nil
	}
	if err := read(&f.Defaults); err != nil {
		return err
	}
	for name, t := range f.Types {
		if err := read(&t); err != nil {
			return err
		}
		f.Types[name] = t
	}
	return nil
}

// Validate reports every problem in the file at once.
func (f *File) Validate() error {
	return errors.Join(f.problems()...)
}

func (f *File) problems() []error {
	var errs []error
	check := func(where string, t Type) {
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
		if t.TrustWindow < 0 || t.TrustWindow > trust.MaxWindow {
			errs = append(errs, fmt.Errorf("%s: trust_window must be within [1, %d]", where, trust.MaxWindow))
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
		if t.RecurringFailures > history.Keep {
			errs = append(errs, fmt.Errorf("%s: recurring_failures must be at most %d (the failures a subject's history keeps)", where, history.Keep))
		}
		if t.PreviousAttempts > history.Keep {
			errs = append(errs, fmt.Errorf("%s: previous_attempts must be at most %d (the outcomes a subject's history keeps)", where, history.Keep))
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
		if t.Template != "" {
			if _, err := template.New("prompt").Funcs(TemplateFuncs).Parse(t.Template); err != nil {
				errs = append(errs, fmt.Errorf("%s: template does not parse: %w", where, err))
			}
		}
		if r := t.SimulatedSuccessRate; r != nil && (*r < 0 || *r > 1) {
			errs = append(errs, fmt.Errorf("%s: simulated_success_rate must be within [0, 1]", where))
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
		errs = append(errs, validateSteps(where, t.Steps)...)
		if v := t.Verifier; v != nil {
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
		}
	}
	check("defaults", f.Defaults)
	weights := func(where string, t Type) {
		if t.OverallWeight == nil && t.RecencyWeight == nil {
			return
		}
		o, r := trust.DefaultOverallWeight, trust.DefaultRecencyWeight
		if t.OverallWeight != nil {
			o = *t.OverallWeight
		}
		if t.RecencyWeight != nil {
			r = *t.RecencyWeight
		}
		if math.Abs(o+r-1) > 1e-9 {
			errs = append(errs, fmt.Errorf("%s: overall_weight %g + recency_weight %g must be 1 (set both)", where, o, r))
		}
	}
	weights("defaults", f.Defaults)
	window := func(where string, t Type) {
		w, m := cmp.Or(t.TrustWindow, trust.DefaultWindow), cmp.Or(t.MinOutcomes, trust.DefaultMinOutcomes)
		if m > w {
			errs = append(errs, fmt.Errorf("%s: min_outcomes %d exceeds trust_window %d: the type could never be gated", where, m, w))
		}
	}
	window("defaults", f.Defaults)
	for _, name := range slices.Sorted(maps.Keys(f.Types)) {
		if !events.ValidType(name) {
			errs = append(errs, fmt.Errorf("types: %q is not a task type name (1-%d characters of a-z, 0-9, _ or -: what a task's \"type\" may be)", name, events.MaxTypeLen))
		}
		check("types."+name, f.Types[name])
		if t := f.Types[name]; t.OverallWeight != nil || t.RecencyWeight != nil {
			weights("types."+name, f.For(name))
		}
		if t := f.Types[name]; t.TrustWindow != 0 || t.MinOutcomes != 0 {
			window("types."+name, f.For(name))
		}
	}
	return errs
}

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
	if len(t.Command) == 0 {
		t.Command = d.Command
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
// rung_floor (0: never hand off for it) and rung_min_samples.
func (t Type) Scoring(p trust.Policy) trust.Policy {
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
		p.OverallWeight, p.RecencyWeight = trust.DefaultOverallWeight, trust.DefaultRecencyWeight
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
