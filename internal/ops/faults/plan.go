package faults

import (
	"fmt"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Answers a scripted model gives, one letter per attempt.
const (
	AnswerSuccess       = 'S' // 200, the task succeeded (billed)
	AnswerFailure       = 'F' // 200, the model reports the task failed (billed)
	AnswerDeterministic = 'D' // 400 invalid_request_error: never resent identically
	AnswerAuth          = 'A' // 401 invalid_api_key: straight to a human
	AnswerTransient     = 'T' // 503 with Retry-After: the same request later, not an attempt
)

// Plan is what the scripted model answers one task, attempt by attempt.
type Plan struct {
	// Answers holds one letter per attempt (AnswerSuccess, AnswerFailure,
	// AnswerDeterministic, AnswerAuth); attempts past the end get the last.
	Answers string
	// Transient is how many 503s each call of the first attempt gets
	// before its answer.
	Transient int
}

func (p Plan) String() string {
	if p.Transient > 0 {
		return fmt.Sprintf("%s (first attempt: %d transient)", p.Answers, p.Transient)
	}
	return p.Answers
}

// Answer is the letter of attempt (1-based).
func (p Plan) Answer(attempt int) byte {
	if p.Answers == "" {
		return AnswerSuccess
	}
	return p.Answers[min(max(attempt, 1), len(p.Answers))-1]
}

// Expect is how a task with this plan ends when nothing stops it early:
// after how many attempts, and whether it succeeds. maxRetries is the
// attempt limit of the task's ladder; an auth failure hands off at once.
func (p Plan) Expect(maxRetries int) (attempts int, succeeds bool) {
	for a := 1; ; a++ {
		switch p.Answer(a) {
		case AnswerSuccess:
			return a, true
		case AnswerAuth:
			return a, false
		}
		if a >= maxRetries {
			return a, false
		}
	}
}

// Outcome is the outcome and error class of an attempt answered with letter.
func Outcome(letter byte) (outcome string, class events.ErrorClass) {
	switch letter {
	case AnswerSuccess:
		return events.OutcomeSuccess, ""
	case AnswerFailure:
		return events.OutcomeFailure, events.ErrorClassTask
	case AnswerDeterministic:
		return events.OutcomeFailure, events.ErrorClassDeterministic
	case AnswerAuth:
		return events.OutcomeFailure, events.ErrorClassAuth
	}
	return "", ""
}
