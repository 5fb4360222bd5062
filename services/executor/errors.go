package executor

import (
	"errors"
	"fmt"
	"net/http"
)

// Error classes of a failed Result (events.Result.ErrorClass).
const (
	// ErrorClassModel: the call to the model failed (HTTP error, timeout,
	// connection error). The error-discipline work splits it further.
	ErrorClassModel = "model"
	// ErrorClassInvalidOutput: the model answered something ParseResult rejects.
	ErrorClassInvalidOutput = "invalid_output"
	// ErrorClassTask: the model answered and reported that the task failed.
	ErrorClassTask = "task"
)

// ProviderError is a failed call to an OpenAI-compatible endpoint. Err is the
// client's error: an *openai.APIError or *openai.RequestError when the
// endpoint answered with an error status, a network or context error
// otherwise — reach them with errors.As / errors.Is. StatusCode and Header are
// those of the HTTP answer (0 and nil when none arrived), so Retry-After and
// the like can be read.
type ProviderError struct {
	Model      string
	StatusCode int
	Header     http.Header
	Err        error
}

func (e *ProviderError) Error() string {
	return fmt.Sprintf("model %s: %v", e.Model, e.Err)
}

func (e *ProviderError) Unwrap() error { return e.Err }

// ErrInvalidOutput marks every answer ParseResult rejects.
var ErrInvalidOutput = errors.New("invalid model output")

// InvalidOutputError says why an answer is not a valid structured result.
type InvalidOutputError struct {
	// Reason is what is wrong.
	Reason string
	// Answer is the model's whole answer.
	Answer string
}

// answerExcerpt is how many characters of the answer an error quotes.
const answerExcerpt = 200

func (e *InvalidOutputError) Error() string {
	return fmt.Sprintf("invalid model output: %s; the answer was %q", e.Reason, excerpt(e.Answer, answerExcerpt))
}

// Is makes errors.Is(err, ErrInvalidOutput) true.
func (e *InvalidOutputError) Is(target error) bool { return target == ErrInvalidOutput }

// excerpt cuts s to at most n runes, marking the cut.
func excerpt(s string, n int) string {
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos] + "…"
		}
		i++
	}
	return s
}
