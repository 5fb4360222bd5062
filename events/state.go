package events

import "time"

// Task statuses.
const (
	StatusPending          = "pending"
	StatusVerifying        = "verifying"
	StatusRunning          = "running"
	StatusSucceeded        = "succeeded"
	StatusCancelled        = "cancelled"
	StatusNeedsHumanReview = "needs_human_review"
	StatusBlocked          = "blocked"
	StatusFailed           = "failed"
	StatusParked           = "parked"
)

// Terminal reports whether a task in this status stays there unless a human acts.
func Terminal(status string) bool {
	switch status {
	case StatusSucceeded, StatusCancelled, StatusNeedsHumanReview, StatusBlocked, StatusFailed:
		return true
	}
	return false
}

// TaskState is the current state of one task, kept in KV and derived from the
// task's events (dispatch rebuild recomputes it from the stream).
type TaskState struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Subject   string `json:"subject"`
	Status    string `json:"status"`
	Attempts  int    `json:"attempts"`
	Pass      int    `json:"pass"`
	LastError string `json:"last_error,omitempty"`
	// Reason explains a terminal status (the gate's reason, the escalation reason).
	Reason    string          `json:"reason,omitempty"`
	History   []AttemptRecord `json:"history,omitempty"`
	TokensIn  int             `json:"tokens_in"`
	TokensOut int             `json:"tokens_out"`
	Cost      float64         `json:"cost"`
	// SubmitSeq is the stream sequence of the submission that created the task:
	// a redelivery of that submission is told apart from a second submission.
	SubmitSeq uint64    `json:"submit_seq"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}
