package events

import "time"

// Versioned event names, carried in the Dispatch-Event header. A breaking change
// to an event gets a new version; the old name keeps its old meaning.
const (
	EventSubmit    = "submit.v1"
	EventQueued    = "task.queued.v1"
	EventRetry     = "task.retry.v1"
	EventVerified  = "task.verified.v1"
	EventCancelled = "task.cancelled.v1"
	EventAdmitted  = "task.admitted.v1"
	EventPrompted  = "task.prompted.v1"
	EventExecuted  = "task.executed.v1"
	EventSucceeded = "task.succeeded.v1"
	EventGated     = "review.gated.v1"
	EventEscalated = "review.escalated.v1"
	EventRejected  = "review.rejected.v1"
	EventPoison    = "review.poison.v1"
)

// Run is the dispatch context that travels with a task from stage to stage.
type Run struct {
	// Pass counts trips through the pipeline (1-based). It is part of every
	// Nats-Msg-Id, so each trip's events are distinct and a redelivered
	// message republishes the same ids.
	Pass int `json:"pass"`
	// Attempt is the attempt number the ladder counts (1-based).
	Attempt int `json:"attempt"`
	// Rung is the escalation rung of this attempt (REFINE, PIVOT, RESEARCH).
	Rung string `json:"rung,omitempty"`
	// Step is the pipeline step this pass runs ("execute" without a pipeline).
	Step string `json:"step,omitempty"`
	// Context is error output carried into this pass (the last failure, or a
	// later step's output when a pipeline went back).
	Context string `json:"context,omitempty"`
	// Note is a human reviewer's note for the next prompt.
	Note string `json:"note,omitempty"`
}

// Base is embedded in every task event.
type Base struct {
	Task Task `json:"task"`
	Run  Run  `json:"run"`
	// At is when the event was produced.
	At time.Time `json:"at"`
	// By names the service instance that produced it (service@host:pid).
	By string `json:"by"`
}

// Queued is published by intake once a submission is accepted.
type Queued struct {
	Base
}

// Retry is published by the recorder to send a task through the pipeline again.
type Retry struct {
	Base
	// Reason is why the previous pass did not finish the task.
	Reason string `json:"reason"`
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

// Verified is published by the verifier when the task should go on.
type Verified struct {
	Base
	Verification Verification `json:"verification"`
}

// Cancelled is published by the verifier for a stale task, or when a
// fail-closed verifier errors. No model is called.
type Cancelled struct {
	Base
	Verification Verification `json:"verification"`
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
}

// Admitted is published by the gate when the task may be dispatched.
type Admitted struct {
	Base
	Trust TrustDecision `json:"trust"`
}

// Gated is the review record of a task the gate blocked (status needs_human_review).
type Gated struct {
	Base
	Trust  TrustDecision `json:"trust"`
	Reason string        `json:"reason"`
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
}

// Outcomes of one attempt.
const (
	OutcomeSuccess = "success"
	OutcomeFailure = "failure"
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
	ErrorClass string  `json:"error_class,omitempty"`
	Model      string  `json:"model,omitempty"`
	Simulated  bool    `json:"simulated,omitempty"`
	TokensIn   int     `json:"tokens_in"`
	TokensOut  int     `json:"tokens_out"`
	Cost       float64 `json:"cost"`
	DurationMS int64   `json:"duration_ms"`
}

// Executed is published by the executor with the attempt's result.
type Executed struct {
	Base
	Result Result `json:"result"`
}

// Succeeded is published by the recorder when a task is done.
type Succeeded struct {
	Base
	Result Result `json:"result"`
}

// AttemptRecord is one attempt in a task's decision tree.
type AttemptRecord struct {
	Attempt   int       `json:"attempt"`
	Pass      int       `json:"pass"`
	Rung      string    `json:"rung,omitempty"`
	Step      string    `json:"step,omitempty"`
	Approach  string    `json:"approach,omitempty"`
	Outcome   string    `json:"outcome"`
	Reason    string    `json:"reason,omitempty"`
	TokensIn  int       `json:"tokens_in"`
	TokensOut int       `json:"tokens_out"`
	Cost      float64   `json:"cost"`
	At        time.Time `json:"at"`
}

// Escalated is the one review record of a task the mesh gave up on (status blocked).
type Escalated struct {
	Base
	Reason     string          `json:"reason"`
	TrustScore float64         `json:"trust_score"`
	Attempts   []AttemptRecord `json:"attempts"`
	TokensIn   int             `json:"tokens_in"`
	TokensOut  int             `json:"tokens_out"`
	Cost       float64         `json:"cost"`
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
