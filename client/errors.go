package client

import (
	"errors"
	"fmt"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Sentinels an *Error matches with errors.Is, by its code.
var (
	// ErrInvalid: the task or the request is invalid (400); Problems lists why.
	ErrInvalid = errors.New("invalid")
	// ErrNotFound: no task has this id (404).
	ErrNotFound = errors.New("task not found")
	// ErrRejected: the task submitted with this id was rejected as invalid
	// and never ran (422); Problems says why.
	ErrRejected = errors.New("task rejected")
	// ErrConflict: a task with this id exists and was submitted with
	// another body (409); Problems names what differs. Nothing was queued.
	ErrConflict = errors.New("task id taken by another body")
	// ErrUnavailable: no service answered, or it is stopping or busy (503):
	// try again.
	ErrUnavailable = errors.New("dispatch service unavailable")
)

// Error is a failed answer of the mesh's API (schema api.error.v1).
type Error struct {
	// Code is 400, 404, 409, 422, 500 or 503 (events.Code*).
	Code int `json:"code"`
	// Message says what went wrong, on one line.
	Message string `json:"message"`
	// Problems lists every problem found, one sentence each.
	Problems []string `json:"problems"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%d)", e.Message, e.Code) }

// Is matches the sentinel of e's code.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrInvalid:
		return e.Code == events.CodeBadRequest
	case ErrNotFound:
		return e.Code == events.CodeNotFound
	case ErrRejected:
		return e.Code == events.CodeRejected
	case ErrConflict:
		return e.Code == events.CodeConflict
	case ErrUnavailable:
		return e.Code == events.CodeUnavailable
	}
	return false
}

// asError turns an *events.APIError into an *Error; other errors pass.
func asError(err error) error {
	var ae *events.APIError
	if errors.As(err, &ae) {
		return &Error{Code: ae.Code, Message: ae.Message, Problems: ae.Problems}
	}
	return err
}
