package events

import (
	"fmt"
	"time"
)

// Versioned event names, carried in the Dispatch-Event header. A breaking change
// to an event gets a new version; the old name keeps its old meaning.
const (
	EventSubmit    = "submit.v1"
	EventQueued    = "task.queued.v1"
	EventIndexed   = "task.indexed.v1" // the task index entry (IndexEntry), dispatch.index.<type>.<key>
	EventRetry     = "task.retry.v1"
	EventVerified  = "task.verified.v1"
	EventCancelled = "task.cancelled.v1"
	EventAdmitted  = "task.admitted.v1"
	EventHeld      = "task.held.v1"
	EventPrompted  = "task.prompted.v1"
	EventExecuted  = "task.executed.v1"
	EventSucceeded = "task.succeeded.v1"
	EventGated     = "review.gated.v1"
	EventEscalated = "review.escalated.v1"
	EventRejected  = "review.rejected.v1"
	EventPoison    = "review.poison.v1"
	EventStuck     = "review.stuck.v1"
	EventAction    = "review.action.v1"
)

// StepExecute is the one step of a task whose type has no pipeline.
const StepExecute = "execute"

// Run is the dispatch context that travels with a task from stage to stage.
type Run struct {
	// Pass counts trips through the pipeline (1-based). It is part of every
	// Nats-Msg-Id, so each trip's events are distinct and a redelivered
	// message republishes the same ids.
	Pass int `json:"pass"`
	// Attempt is the attempt number the ladder counts (1-based).
	Attempt int `json:"attempt"`
	// Rung is the escalation rung of this attempt (REFINE, PIVOT, RESEARCH).
	Rung Rung `json:"rung,omitempty"`
	// Step is the pipeline step this pass runs (StepExecute without a pipeline).
	Step string `json:"step,omitempty"`
	// Context is error output carried into this pass (the last failure, or a
	// later step's output when a pipeline went back).
	Context string `json:"context,omitempty"`
	// StepInput is what the previous step of a pipeline handed this one
	// when it passed (its approach, summary and changes): the next step's
	// input, not an error.
	StepInput string `json:"step_input,omitempty"`
	// Note is a human reviewer's note for the next prompt.
	Note string `json:"note,omitempty"`
	// LastErrorClass classifies the previous attempt's failure (ErrorClass*);
	// after a deterministic failure the prompt asks the model to state what
	// it changes before it acts.
	LastErrorClass ErrorClass `json:"last_error_class,omitempty"`
	// DeadEnds are the approaches that already failed; the PIVOT rung must
	// not repeat them. On a prompted attempt (and its outcome) they are
	// the dead ends its prompt showed: those the PIVOT rule enforces.
	DeadEnds []DeadEnd `json:"dead_ends,omitempty"`
	// Reviewed is set when a human requeued the task: the gate lets it through.
	Reviewed bool `json:"reviewed,omitempty"`
	// Probe is set when the gate let the task through a blocked type as an
	// exploration probe: its retries keep going while the type stays blocked.
	Probe bool `json:"probe,omitempty"`
	// Readmitted is set when the gate let the task through after holding
	// it for its type's trust: its outcomes say how the rest of the type's
	// held tasks may fare (the held backlog), not how its new tasks do.
	Readmitted bool `json:"readmitted,omitempty"`
}

// DeadEnd is an approach that failed, kept so later attempts avoid it.
// Attempt is the task's attempt that failed with it; 0 for an earlier
// task's failure on the same subject (shown to a task that starts on
// PIVOT because its subject keeps failing).
type DeadEnd struct {
	Approach string `json:"approach"`
	Reason   string `json:"reason"`
	Attempt  int    `json:"attempt"`
	Rung     Rung   `json:"rung"`
}

// Rung is a rung of the escalation ladder (SPEC §8). It is stored and sent
// as its string.
type Rung string

// Escalation rungs (SPEC §8).
const (
	RungRefine   Rung = "REFINE"
	RungPivot    Rung = "PIVOT"
	RungResearch Rung = "RESEARCH"
	RungHandoff  Rung = "HANDOFF"
)

// Valid reports whether r is one of the Rung constants.
func (r Rung) Valid() bool {
	switch r {
	case RungRefine, RungPivot, RungResearch, RungHandoff:
		return true
	}
	return false
}

// ParseRung reads a rung; an unknown one is an error.
func ParseRung(s string) (Rung, error) {
	if r := Rung(s); r.Valid() {
		return r, nil
	}
	return "", fmt.Errorf("unknown rung %q", s)
}

// ErrorClass classifies a failed attempt (Result.ErrorClass). It is stored
// and sent as its string; the empty class means the attempt did not fail.
type ErrorClass string

// Error classes of a failed attempt.
const (
	// ErrorClassTask: the model answered and reported that the task failed.
	ErrorClassTask ErrorClass = "task"
	// ErrorClassInvalidOutput: the answer was not the structured result asked for.
	ErrorClassInvalidOutput ErrorClass = "invalid_output"
	// ErrorClassModel: the model call failed in a way not classified further.
	ErrorClassModel ErrorClass = "model"
	// ErrorClassTransient: 5xx, timeouts, resets, 429 with Retry-After. Never
	// an attempt, except when a task's transient budget is spent
	// ("provider unavailable").
	ErrorClassTransient ErrorClass = "transient"
	// ErrorClassDeterministic: 400, 404, 422 …: the identical request is never sent again.
	ErrorClassDeterministic ErrorClass = "deterministic"
	// ErrorClassAuth and ErrorClassQuota short-circuit to a human (401/403, quota exhausted).
	ErrorClassAuth  ErrorClass = "auth"
	ErrorClassQuota ErrorClass = "quota"
	// ErrorClassConfig: the deployment is misconfigured — the model or the
	// endpoint does not exist (404), the prompt exceeds the model's context.
	// Short-circuits to a human with what to fix.
	ErrorClassConfig ErrorClass = "config"
	// ErrorClassToolUnavailable: a tool did not answer (no responders,
	// timeouts) for as long as the type's tool wait allows. Short-circuits to
	// a human, naming the tool and its subject.
	ErrorClassToolUnavailable ErrorClass = "tool_unavailable"
	// ErrorClassTimeout: an agent command timed out; short-circuits to a human.
	ErrorClassTimeout ErrorClass = "timeout"
	// ErrorClassRefused: the request was identical to one that already failed
	// deterministically, so it was not sent.
	ErrorClassRefused ErrorClass = "refused"
	// ErrorClassDeadEnd: on PIVOT the declared approach repeated a dead end.
	ErrorClassDeadEnd ErrorClass = "dead_end"
	// ErrorClassStep: a command step (validator, test runner) failed.
	ErrorClassStep ErrorClass = "step"
	// ErrorClassBudget: the task spent more than its budget.
	ErrorClassBudget ErrorClass = "budget"
)

// ShortCircuits reports whether a failure of this class goes straight to a
// human: retrying cannot help.
func ShortCircuits(class ErrorClass) bool {
	return class == ErrorClassTimeout || DeploymentFault(class)
}

// DeploymentFault reports whether a failure of this class is the
// deployment's, not the task's: a refused API key, an exhausted quota, a
// misconfigured model or endpoint, a tool that does not answer. Such a
// failure never lowers a type's trust, and its error leads with what to fix.
func DeploymentFault(class ErrorClass) bool {
	switch class {
	case ErrorClassAuth, ErrorClassQuota, ErrorClassConfig, ErrorClassToolUnavailable:
		return true
	}
	return false
}

// Valid reports whether c is one of the ErrorClass constants.
func (c ErrorClass) Valid() bool {
	switch c {
	case ErrorClassTask, ErrorClassInvalidOutput, ErrorClassModel, ErrorClassTransient,
		ErrorClassDeterministic, ErrorClassAuth, ErrorClassQuota, ErrorClassConfig,
		ErrorClassToolUnavailable, ErrorClassTimeout, ErrorClassRefused, ErrorClassDeadEnd,
		ErrorClassStep, ErrorClassBudget:
		return true
	}
	return false
}

// ParseErrorClass reads an error class; an unknown one is an error.
func ParseErrorClass(s string) (ErrorClass, error) {
	if c := ErrorClass(s); c.Valid() {
		return c, nil
	}
	return "", fmt.Errorf("unknown error class %q", s)
}

// Base is embedded in every task event.
type Base struct {
	Task Task `json:"task"`
	Run  Run  `json:"run"`
	// At is when the event was produced.
	At time.Time `json:"at"`
	// By names the service instance that produced it (service@host:pid).
	By string `json:"by"`
	// PolicyRev is the revision of the policy (the key "current" of the KV
	// bucket dispatch_policy) the producing service decided under: dispatch
	// rebuild recomputes the event with that revision. 0 (absent): no
	// revision was recorded — an event from before the policy lived in the
	// bucket, or from a mesh run with a fixed policy.
	PolicyRev uint64 `json:"policy_rev,omitempty"`
}

// Queued is published by intake once a submission is accepted.
type Queued struct {
	Base
	// Sealed is the task's state as intake created it, for the executor
	// (optional; see Sealed).
	Sealed *Sealed `json:"sealed,omitempty"`
}

// Retry is published by the recorder to send a task through the pipeline
// again (and by a human's requeue).
type Retry struct {
	Base
	// Reason is why the previous pass did not finish the task.
	Reason string `json:"reason"`
	// WakeAt, when set, parks the task until then (a skipped pipeline task
	// comes back later): the verifier holds it with a delayed nak.
	WakeAt time.Time `json:"wake_at,omitzero"`
	// Sealed is the task's state as the recorder left it, for the
	// executor (optional; see Sealed).
	Sealed *Sealed `json:"sealed,omitempty"`
	// Shadow is the recorder's decision on the attempt under the shadow
	// policy (dispatch policy shadow), set by the recorder when there is
	// one: recorded, never enforced.
	Shadow *ShadowDecision `json:"shadow,omitempty"`
}

// Verdicts of a staleness check.
const (
	VerdictExists  = "exists"  // the problem is still there: go on
	VerdictStale   = "stale"   // already resolved: cancel, spend nothing
	VerdictError   = "error"   // the verifier failed; fail-open or fail-closed decides
	VerdictSkipped = "skipped" // no verifier registered for the type
)

// Verification is the verifier's finding.
type Verification struct {
	Verdict  string `json:"verdict"`
	Verifier string `json:"verifier"` // none, nats, http, command
	Detail   string `json:"detail,omitempty"`
	// FailOpen is true when a verifier error let the task through.
	FailOpen bool `json:"fail_open,omitempty"`
}

// Verified is published by the verifier when the task should go on — and,
// for a type without a verifier, by intake for a new task and by the
// recorder for a retry (verdict skipped, verifier none): a pass with
// nothing to verify goes to the gate at once.
type Verified struct {
	Base
	Verification Verification `json:"verification"`
	// Reason is why this pass runs, when the recorder sent a retry straight
	// to the gate: the previous attempt's failure (a retry's Reason).
	Reason string `json:"reason,omitempty"`
	// Sealed is the task's state as it was last written, for the executor
	// (optional; see Sealed).
	Sealed *Sealed `json:"sealed,omitempty"`
	// Shadow is the recorder's decision on the attempt under the shadow
	// policy (dispatch policy shadow), set by the recorder when there is
	// one: recorded, never enforced.
	Shadow *ShadowDecision `json:"shadow,omitempty"`
}

// Cancelled is published by the verifier for a stale task, or when a
// fail-closed verifier errors. No model is called.
type Cancelled struct {
	Base
	Verification Verification `json:"verification"`
}

// Cause says why the gate decided what it did: a typed value, never a
// sentence to match later.
type Cause string

// Gate causes (TrustDecision.Cause).
const (
	CauseTrusted  Cause = "trusted"   // the type's trust score is at or above the threshold
	CauseUnproven Cause = "unproven"  // too few outcomes to score: admitted as one of the type's canaries
	CauseExempt   Cause = "exempt"    // the type is never gated
	CauseReviewed Cause = "reviewed"  // a human requeued the task
	CauseProbe    Cause = "probe"     // an exploration probe through a blocked type (or one of its retries)
	CauseTrust    Cause = "trust"     // blocked: the trust score is below the threshold
	CauseBudget   Cause = "budget"    // blocked: the type spent its daily budget
	CauseRungRate Cause = "rung_rate" // handed off: retries on the next rung rarely succeed for the type
)

// Valid reports whether c is one of the Cause constants.
func (c Cause) Valid() bool {
	switch c {
	case CauseTrusted, CauseUnproven, CauseExempt, CauseReviewed, CauseProbe, CauseTrust, CauseBudget, CauseRungRate:
		return true
	}
	return false
}

// TrustDecision is the gate's finding for a task type.
type TrustDecision struct {
	Score     float64 `json:"score"`
	Outcomes  int     `json:"outcomes"`
	Threshold float64 `json:"threshold"`
	Exempt    bool    `json:"exempt,omitempty"`
	Probe     bool    `json:"probe,omitempty"`
	Blocked   bool    `json:"blocked,omitempty"`
	Reason    string  `json:"reason,omitempty"`
	// Cause is why the gate decided so (Cause* constants).
	Cause Cause `json:"cause,omitempty"`
	// RungTries and RungSuccesses are the type's measured retries on the
	// task's next rung, when the gate weighed them.
	RungTries     int `json:"rung_tries,omitempty"`
	RungSuccesses int `json:"rung_successes,omitempty"`
	// Rung is set when the gate moved a retry up the ladder because
	// retries on its own rung rarely succeed for the type: the rung it runs on.
	Rung Rung `json:"rung,omitempty"`
	// Shadow is the decision the shadow policy (dispatch policy shadow)
	// would have made on the pass: computed and recorded, never enforced.
	Shadow *ShadowDecision `json:"shadow,omitempty"`
}

// ShadowDecision is a decision computed under the shadow policy.
type ShadowDecision struct {
	// Act is what it would have done with the pass: admit, hold, block,
	// handoff (the gate's), or the recorder's decision after an attempt.
	Act string `json:"act"`
	// Cause is the gate's cause under it.
	Cause  Cause  `json:"cause,omitempty"`
	Reason string `json:"reason,omitempty"`
	// PolicyRev is the shadow policy's revision in the policy bucket.
	PolicyRev uint64 `json:"policy_rev,omitempty"`
}

// Admitted is published by the gate when the task may be dispatched.
type Admitted struct {
	Base
	Trust TrustDecision `json:"trust"`
	// Sealed is relayed from the Verified event (optional; see Sealed).
	Sealed *Sealed `json:"sealed,omitempty"`
}

// Hold is why the gate holds a pass back instead of admitting it.
type Hold string

const (
	// HoldTrust: its type scores below its trust threshold (status held).
	HoldTrust Hold = "trust"
	// HoldCanary: its type is unproven and every canary place is taken;
	// the task's status does not change while it waits.
	HoldCanary Hold = "canary"
	// HoldQueued: the queue before the model is full and its type had
	// more than its share of the latest admissions: it waits its turn,
	// its status unchanged, so a flood of one type does not fill the
	// executor's queue ahead of every other type.
	HoldQueued Hold = "queued"
	// HoldRung: a retry climbs onto a rung its type has too few retries
	// measured on, and as many of its retries as may measure that rung
	// at once are in flight: it waits for their outcomes, its status
	// unchanged, instead of paying for the same rung blind.
	HoldRung Hold = "rung"
)

// ForOutcomes reports whether a pass held for h waits for outcomes of its
// type: its canaries' (HoldCanary), or those of the retries measuring its
// rung (HoldRung).
func (h Hold) ForOutcomes() bool { return h == HoldCanary || h == HoldRung }

// Held is published by the gate on dispatch.task.<id>.held when it holds a
// pass back — for its type's trust or for its canaries' results — instead
// of keeping it in its own consumer: the gate's held consumer looks at it
// again until it is admitted, probed, or (held for trust past the hold
// time) sent to a human. It carries what the admission needs.
type Held struct {
	Base
	Hold   Hold          `json:"hold"`
	Trust  TrustDecision `json:"trust"`
	Reason string        `json:"reason"`
	// Sealed is relayed from the Verified event (optional; see Sealed).
	Sealed *Sealed `json:"sealed,omitempty"`
}

// Gated is the review record of a task the gate blocked (status needs_human_review).
type Gated struct {
	Base
	Trust  TrustDecision `json:"trust"`
	Reason string        `json:"reason"`
	// Attempts are what was tried before the gate stopped the task (a retry
	// stopped when its type's trust collapsed); empty on a first pass.
	Attempts []AttemptRecord `json:"attempts,omitempty"`
}

// Message is one chat message of a prompt.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Prompt is what the prompt builder hands the executor.
type Prompt struct {
	Model    string    `json:"model,omitempty"`
	Messages []Message `json:"messages"`
}

// Prompted is published by the prompt builder.
type Prompted struct {
	Base
	Prompt Prompt `json:"prompt"`
	// Sealed is relayed from the Admitted event (optional; see Sealed).
	Sealed *Sealed `json:"sealed,omitempty"`
}

// Outcomes of one attempt.
const (
	OutcomeSuccess = "success"
	OutcomeFailure = "failure"
)

// Caps on a Result's free text, in bytes. The executor cuts an answer of
// a model or an agent command to them when it decodes it (a cut text ends
// "… [cut: 12,345 bytes more]"), so the Executed event always fits the
// servers' max_payload (1 MB): the answer is paid for once, never lost to
// an event that cannot be stored. Even escaped six times over in JSON, an
// answer leaves the rest of the event more than 750 KiB.
const (
	// MaxApproach bounds Approach. A task's dead ends and its subject's
	// history keep an approach whole up to this size, so an answer that
	// repeats one is recognised.
	MaxApproach = 2 << 10
	MaxSummary  = 8 << 10
	// MaxChanges bounds how many Changes an answer keeps, MaxChange the
	// size of each.
	MaxChanges = 32
	MaxChange  = 512
	// MaxError bounds Error (a failure's summary, a provider's message).
	MaxError = 8 << 10
)

// Result is what one execution produced.
type Result struct {
	Outcome  string   `json:"outcome"`
	Approach string   `json:"approach,omitempty"`
	Summary  string   `json:"summary,omitempty"`
	Changes  []string `json:"changes,omitempty"`
	// Error says why a failed attempt failed.
	Error string `json:"error,omitempty"`
	// ErrorClass classifies Error (model, invalid_output, …).
	ErrorClass ErrorClass `json:"error_class,omitempty"`
	// Model is the model that answered (as the provider names it), or
	// was asked last.
	Model string `json:"model,omitempty"`
	// Route names the entry of the type's model chain (policy "models")
	// that answered, or was called last; absent for a type without a chain.
	Route string `json:"route,omitempty"`
	// Fallbacks names the models of the chain the answering call passed
	// over before Route — cooling down, marked dead, failed — in order.
	Fallbacks []string `json:"fallbacks,omitempty"`
	// Banned are the requests of the attempt that failed deterministically
	// on models of the chain the call then passed over (their deployment's
	// fault), each "<request_hash>/<error_class>": banned for the task as
	// RequestHash is.
	Banned    []string `json:"banned,omitempty"`
	Simulated bool     `json:"simulated,omitempty"`
	// RequestHash identifies the request sent (model + normalised messages +
	// parameters); a deterministic failure bans it for the task.
	RequestHash string `json:"request_hash,omitempty"`
	// Refused is set when the request was not sent: it repeated a request
	// that already failed deterministically. No tokens were spent.
	Refused bool `json:"refused,omitempty"`
	// TransientRetries counts the transient failures this attempt rode out.
	TransientRetries int `json:"transient_retries,omitempty"`
	// ToolCalls and ToolRefusals count the attempt's tool calls and the
	// calls refused for repeating an identical failed call.
	ToolCalls    int     `json:"tool_calls,omitempty"`
	ToolRefusals int     `json:"tool_refusals,omitempty"`
	TokensIn     int     `json:"tokens_in"`
	TokensOut    int     `json:"tokens_out"`
	Cost         float64 `json:"cost"`
	DurationMS   int64   `json:"duration_ms"`
}

// Executed is published by the executor with the attempt's result.
type Executed struct {
	Base
	Result Result `json:"result"`
	// State is the task's state as the executor left it, for the
	// recorder's write (optional; see StateAt).
	State *StateAt `json:"state,omitempty"`
}

// Succeeded is published by the recorder when a task is done.
type Succeeded struct {
	Base
	Result Result `json:"result"`
	// Shadow is the recorder's decision on the attempt under the shadow
	// policy (dispatch policy shadow), set by the recorder when there is
	// one: recorded, never enforced.
	Shadow *ShadowDecision `json:"shadow,omitempty"`
}

// AttemptRecord is one attempt in a task's decision tree.
type AttemptRecord struct {
	Attempt   int       `json:"attempt"`
	Pass      int       `json:"pass"`
	Rung      Rung      `json:"rung,omitempty"`
	Step      string    `json:"step,omitempty"`
	Approach  string    `json:"approach,omitempty"`
	Outcome   string    `json:"outcome"`
	Reason    string    `json:"reason,omitempty"`
	TokensIn  int       `json:"tokens_in"`
	TokensOut int       `json:"tokens_out"`
	Cost      float64   `json:"cost"`
	At        time.Time `json:"at"`
	// ErrorClass classifies a failed attempt's Reason (ErrorClass*): a
	// refused request is told from a sent one without reading Reason.
	ErrorClass ErrorClass `json:"error_class,omitempty"`
	// Model is the model that answered the attempt (Result.Route for a
	// type with a model chain, else Result.Model); absent in records
	// written before it was kept.
	Model string `json:"model,omitempty"`
}

// Escalated is the one review record of a task the mesh gave up on (status blocked).
type Escalated struct {
	Base
	Reason string `json:"reason"`
	// Cause is set when the gate handed the task off before another attempt
	// (CauseRungRate); empty when the recorder did after an attempt.
	Cause      Cause           `json:"cause,omitempty"`
	TrustScore float64         `json:"trust_score"`
	Attempts   []AttemptRecord `json:"attempts"`
	TokensIn   int             `json:"tokens_in"`
	TokensOut  int             `json:"tokens_out"`
	Cost       float64         `json:"cost"`
	// Shadow is the recorder's decision on the attempt under the shadow
	// policy (dispatch policy shadow), set by the recorder when there is
	// one: recorded, never enforced.
	Shadow *ShadowDecision `json:"shadow,omitempty"`
}

// Rejected is the review record of input the mesh could not accept. The
// message body is the original bytes, untouched; the Dispatch-Error header says
// what is wrong and Dispatch-Orig-Subject where it arrived. This struct is the
// decoded view used by tools.
type Rejected struct {
	Error           string `json:"error"`
	OriginalSubject string `json:"original_subject"`
	Original        []byte `json:"original"`
}

// Stuck is the review record of a pipeline task that was skipped as often as
// its skip budget allows and still could not finish.
type Stuck struct {
	Base
	Reason   string          `json:"reason"`
	Skips    int             `json:"skips"`
	Attempts []AttemptRecord `json:"attempts"`
	// Shadow is the recorder's decision on the attempt under the shadow
	// policy (dispatch policy shadow), set by the recorder when there is
	// one: recorded, never enforced.
	Shadow *ShadowDecision `json:"shadow,omitempty"`
}

// Human review actions.
const (
	ActionResolve = "resolve" // the human fixed it: task succeeded
	ActionReject  = "reject"  // not worth doing: task failed
	ActionRequeue = "requeue" // run it again, the note reaches the prompt
	// ActionCancel stops a pending or running task: status cancelled, the
	// executor abandons its model call, nothing of the task runs again.
	ActionCancel = "cancel"
)

// Action is a human's decision on a task under review. Every action is an
// event on dispatch.review.action.<id>, so the audit trail shows who did what.
type Action struct {
	TaskID string    `json:"task_id"`
	Action string    `json:"action"`
	Note   string    `json:"note,omitempty"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
}
