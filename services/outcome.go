package services

import (
	"errors"
	"fmt"
	"time"
)

// SnoozeError asks the router to deliver the message again after a delay,
// without it counting as a failure (a transient error, a Retry-After).
type SnoozeError struct {
	Delay time.Duration
	Err   error
}

func (e *SnoozeError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("snoozed for %s", e.Delay)
	}
	return fmt.Sprintf("snoozed for %s: %v", e.Delay, e.Err)
}
func (e *SnoozeError) Unwrap() error { return e.Err }

// Snooze returns an error that naks the message with delay d.
func Snooze(d time.Duration, err error) error { return &SnoozeError{Delay: d, Err: err} }

// DeadError asks the router to copy the message to dispatch.review.<Reason>
// with its original bytes and terminate it: retrying cannot help.
type DeadError struct {
	Reason string
	// Key names the review record (dispatch.review.<reason>.<key>); empty
	// means the task id of the message, else its stream sequence.
	Key string
	Err error
}

func (e *DeadError) Error() string { return fmt.Sprintf("%s: %v", e.Reason, e.Err) }
func (e *DeadError) Unwrap() error { return e.Err }

// Dead returns an error that sends the message to review under reason.
func Dead(reason string, err error) error { return &DeadError{Reason: reason, Err: err} }

// DeadKey is Dead with an explicit review key.
func DeadKey(reason, key string, err error) error {
	return &DeadError{Reason: reason, Key: key, Err: err}
}

// IsSnooze reports whether err asks for a snooze, and for how long.
func IsSnooze(err error) (time.Duration, bool) {
	var s *SnoozeError
	if errors.As(err, &s) {
		return s.Delay, true
	}
	return 0, false
}
