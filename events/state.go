package events

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Status is where a task is in its life (SPEC §2). It is stored and sent
// as its string.
type Status string

// Task statuses.
const (
	StatusPending          Status = "pending"
	StatusVerifying        Status = "verifying"
	StatusRunning          Status = "running"
	StatusSucceeded        Status = "succeeded"
	StatusCancelled        Status = "cancelled"
	StatusNeedsHumanReview Status = "needs_human_review"
	StatusBlocked          Status = "blocked"
	StatusFailed           Status = "failed"
	StatusParked           Status = "parked"
	// StatusHeld: the trust gate holds the task for its type's low trust —
	// no tokens spent, not terminal: re-admitted on its own when its type
	// recovers, to a human after the hold time (SPEC §2, §4).
	StatusHeld Status = "held"
)

// Statuses are all task statuses, in a task's usual order.
var Statuses = []Status{
	StatusPending, StatusVerifying, StatusRunning, StatusSucceeded, StatusCancelled,
	StatusNeedsHumanReview, StatusBlocked, StatusFailed, StatusParked, StatusHeld,
}

// Valid reports whether s is one of the Status constants.
func (s Status) Valid() bool { return slices.Contains(Statuses, s) }

// ParseStatus reads a status; an unknown one is an error.
func ParseStatus(s string) (Status, error) {
	if st := Status(s); st.Valid() {
		return st, nil
	}
	return "", fmt.Errorf("unknown task status %q", s)
}

// Decision is what the recorder decided after an attempt (TaskState.Decision).
type Decision string

// Recorder decisions after an attempt (TaskState.Decision).
const (
	DecisionSucceeded Decision = "succeeded" // done
	DecisionRetry     Decision = "retry"     // another attempt (or the next pipeline step)
	DecisionHandoff   Decision = "handoff"   // escalated to a human: status blocked
	DecisionFail      Decision = "fail"      // a pipeline's final "fail": status failed
	DecisionPark      Decision = "park"      // a pipeline's final "skip": parked, comes back at WakeAt
	DecisionStuck     Decision = "stuck"     // skipped as often as allowed: status blocked
)

// Valid reports whether d is one of the Decision constants.
func (d Decision) Valid() bool {
	switch d {
	case DecisionSucceeded, DecisionRetry, DecisionHandoff, DecisionFail, DecisionPark, DecisionStuck:
		return true
	}
	return false
}

// ParseDecision reads a decision; an unknown one is an error.
func ParseDecision(s string) (Decision, error) {
	if d := Decision(s); d.Valid() {
		return d, nil
	}
	return "", fmt.Errorf("unknown decision %q", s)
}

// Terminal reports whether a task in this status stays there unless a human acts.
func Terminal(status Status) bool {
	switch status {
	case StatusSucceeded, StatusCancelled, StatusNeedsHumanReview, StatusBlocked, StatusFailed:
		return true
	}
	return false
}

// Settled reports whether a wait for the task is over: it ended
// (Terminal), or the gate holds it (StatusHeld) — nothing happens to it
// until its type recovers or a human acts.
func Settled(status Status) bool { return Terminal(status) || status == StatusHeld }

// StateAt is a task's state as the service that wrote it last stored it,
// with the revision of that write (in dispatch_tasks). An event carries it
// to the next service that writes the task's state, which tries its
// compare-and-set against that revision instead of reading the state again;
// a write in between makes the revision stale, and the service reads.
type StateAt struct {
	Rev   uint64    `json:"rev"`
	State TaskState `json:"state"`
}

// Sealed is a task's state as a service that writes it stored it (a
// StateAt), sealed for the executor, which starts its first write of the
// attempt from it instead of reading the state. The gate and the prompt
// builder relay it without being able to change it: the MAC is keyed by a
// secret only the services that seal hold (services.Sealer). As
// for StateAt, the revision is the check against a later write: a stale one
// fails the compare-and-set and the executor reads.
type Sealed struct {
	Rev uint64 `json:"rev"`
	// State is the TaskState as the sealing service encoded it: the MAC
	// covers these bytes.
	State json.RawMessage `json:"state"`
	MAC   string          `json:"mac"`
}

// TaskState is the current state of one task, kept in KV and derived from the
// task's events (dispatch rebuild recomputes it from the stream).
type TaskState struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Subject   string `json:"subject"`
	Status    Status `json:"status"`
	Attempts  int    `json:"attempts"`
	Pass      int    `json:"pass"`
	LastError string `json:"last_error,omitempty"`
	// Reason explains a terminal status (the gate's reason, the escalation reason).
	Reason    string          `json:"reason,omitempty"`
	History   []AttemptRecord `json:"history,omitempty"`
	TokensIn  int             `json:"tokens_in"`
	TokensOut int             `json:"tokens_out"`
	Cost      float64         `json:"cost"`
	// Rung is the escalation rung of the next attempt; PivotCount counts
	// attempts made on PIVOT; DeadEnds is the log the ladder reads.
	Rung       Rung      `json:"rung,omitempty"`
	PivotCount int       `json:"pivot_count,omitempty"`
	DeadEnds   []DeadEnd `json:"dead_ends,omitempty"`
	// RoundStart is the attempt count when the current round began: a human
	// requeue starts a new round with a full attempt allowance.
	RoundStart int `json:"round_start,omitempty"`
	// FailedRequests are hashes of requests that failed deterministically:
	// the executor refuses to send them again.
	FailedRequests []string `json:"failed_requests,omitempty"`
	// Refused counts requests refused for repeating a failed one (a
	// refusal ends its pass: one per pass, the last in RefusedPass);
	// TransientRetries counts transient failures ridden out.
	Refused          int `json:"refused,omitempty"`
	RefusedPass      int `json:"refused_pass,omitempty"`
	TransientRetries int `json:"transient_retries,omitempty"`
	// Unbilled is what model calls of the current attempt spent before a
	// transient failure cut the attempt short; the attempt's Result adds it.
	Unbilled Usage `json:"unbilled,omitzero"`
	// Resume is the tool loop of the current attempt that a transient
	// failure cut short, kept so its redelivery resumes where it stopped
	// instead of paying for the model's turns again.
	Resume *Resume `json:"resume,omitempty"`
	// Pipeline progress: the current step, retries per step, loops per
	// goto edge ("from>to"), and how often the task was skipped.
	Step        string         `json:"step,omitempty"`
	StepRetries map[string]int `json:"step_retries,omitempty"`
	Loops       map[string]int `json:"loops,omitempty"`
	Skips       int            `json:"skips,omitempty"`
	// StepInputs is what each pipeline step was handed by the step before
	// it when that one passed (Run.StepInput), by step name: a go-back to
	// a step, or a requeue on it, gives it the input it ran with.
	StepInputs map[string]string `json:"step_inputs,omitempty"`
	// Decision is what the recorder decided after the latest attempt: one of
	// the Decision* constants.
	Decision Decision `json:"decision,omitempty"`
	// Cause is why the gate stopped the task, when it did (trust, budget,
	// rung_rate); empty otherwise.
	Cause Cause `json:"cause,omitempty"`
	// WakeAt is when a parked task comes back.
	WakeAt time.Time `json:"wake_at,omitzero"`
	// Actions are the human review actions taken on the task.
	Actions []Action `json:"actions,omitempty"`
	// SubmitSeq is the stream sequence of the submission that created the task:
	// a redelivery of that submission is told apart from a second submission.
	SubmitSeq uint64 `json:"submit_seq"`
	// CallbackURL is the submission's callback_url: where the webhook
	// service POSTs the wait answer once the task settles.
	CallbackURL string    `json:"callback_url,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// Usage is tokens and USD spent.
type Usage struct {
	TokensIn  int     `json:"tokens_in"`
	TokensOut int     `json:"tokens_out"`
	Cost      float64 `json:"cost"`
}

// Add returns u plus v.
func (u Usage) Add(v Usage) Usage {
	return Usage{TokensIn: u.TokensIn + v.TokensIn, TokensOut: u.TokensOut + v.TokensOut, Cost: u.Cost + v.Cost}
}

// Resume is an attempt's tool loop cut short by a transient failure — a
// tool that did not answer, a model call that failed — as the executor
// keeps it between deliveries. The model's turns it holds are paid for
// (their usage is in TaskState.Unbilled): the redelivered attempt answers
// the pending calls first, without a model call, then goes on from Turns.
type Resume struct {
	// Pass is the pass of the attempt; any other pass ignores it.
	Pass int `json:"pass"`
	// Turns are the conversation after the prompt's messages: each
	// assistant message with its tool calls, then the tool results so far.
	Turns []Turn `json:"turns"`
	// Pending are the tool calls of the last assistant turn not answered yet.
	Pending []ToolCall `json:"pending,omitempty"`
	// ToolCalls and ToolRefusals count the loop's tool calls so far, and
	// those refused for repeating a failed call.
	ToolCalls    int `json:"tool_calls,omitempty"`
	ToolRefusals int `json:"tool_refusals,omitempty"`
	// ToolWaitSince is when a tool of this attempt first failed to answer;
	// the attempt waits for its tools at most the type's tool wait from then.
	ToolWaitSince time.Time `json:"tool_wait_since,omitzero"`
	// ToolWaits counts the snoozes spent waiting for a tool (their backoff).
	ToolWaits int `json:"tool_waits,omitempty"`
}

// Turn is one message of a tool loop.
type Turn struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// ToolCalls are the calls an assistant message asked for.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID names the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// ToolCall is one function call a model asked for.
type ToolCall struct {
	// ID is the provider's id of the call.
	ID   string `json:"id"`
	Name string `json:"name"`
	// Arguments is the JSON object of arguments, as the model wrote it.
	Arguments string `json:"arguments"`
}
