package executor

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
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

// Detail is everything the provider said, for the next prompt: the status
// and the error object (type, code, param, message) as JSON, or the raw body
// when it was not an OpenAI error object.
func (e *ProviderError) Detail() string {
	var apiErr *openai.APIError
	var reqErr *openai.RequestError
	switch {
	case errors.As(e.Err, &apiErr):
		status := e.StatusCode
		if status == 0 {
			status = apiErr.HTTPStatusCode
		}
		d := struct {
			Status  int    `json:"status,omitempty"`
			Type    string `json:"type,omitempty"`
			Code    any    `json:"code,omitempty"`
			Param   string `json:"param,omitempty"`
			Message string `json:"message"`
			Inner   any    `json:"innererror,omitempty"`
		}{Status: status, Type: apiErr.Type, Code: apiErr.Code, Message: apiErr.Message}
		if apiErr.Param != nil {
			d.Param = *apiErr.Param
		}
		if apiErr.InnerError != nil {
			d.Inner = apiErr.InnerError
		}
		b, err := json.Marshal(d)
		if err != nil {
			return e.Error()
		}
		return fmt.Sprintf("model %s answered %s: %s", e.Model, statusText(status), b)
	case errors.As(e.Err, &reqErr):
		status := e.StatusCode
		if status == 0 {
			status = reqErr.HTTPStatusCode
		}
		body := strings.TrimSpace(string(reqErr.Body))
		if body == "" {
			body = "(empty body)"
		}
		return fmt.Sprintf("model %s answered %s: %s", e.Model, statusText(status), textcut.ClipEnd(body, MaxErrorOutput))
	}
	return e.Error()
}

func statusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return fmt.Sprintf("%d %s", code, t)
	}
	return fmt.Sprintf("status %d", code)
}

// ToolError is a tool's error reply: the micro error headers
// (Nats-Service-Error-Code, Nats-Service-Error) and the reply body, or an
// error the executor found before sending (unknown tool, arguments that are
// not JSON: code 400). Classify reads Code like an HTTP status.
type ToolError struct {
	Tool        string
	Subject     string
	Code        int
	Description string
	Body        []byte
}

func (e *ToolError) Error() string {
	if len(e.Body) == 0 {
		return fmt.Sprintf("tool %s: %d %s", e.Tool, e.Code, e.Description)
	}
	return fmt.Sprintf("tool %s: %d %s: %s", e.Tool, e.Code, e.Description, e.Body)
}

// ExitTempFail is the exit code (EX_TEMPFAIL) with which an agent command
// says its failure is transient: the task is snoozed, not failed.
const ExitTempFail = 75

// CommandError is a failed run of an agent command or command step.
type CommandError struct {
	Argv []string
	// ExitCode is the exit status, -1 when the command did not exit by
	// itself (it timed out, was killed or could not start).
	ExitCode int
	// TimedOut is set when the run hit its timeout (the process group was killed).
	TimedOut bool
	Timeout  time.Duration
	// Killed is set when a signal ended the command before its timeout:
	// its CPU time limit (CPULimit), a crash, the kernel. The same input
	// would end it the same way: a deterministic failure.
	Killed bool
	// CPULimit is the CPU time limit the command was killed at
	// (procgroup.ErrCPULimit; Config.AgentLimits, CommandLimits).
	CPULimit time.Duration
	// Output is the tail of what the command printed (MaxErrorOutput bytes).
	Output string
	// Err is the underlying error (start failure, exit status).
	Err error
}

func (e *CommandError) Error() string {
	name := strings.Join(e.Argv, " ")
	var msg string
	switch {
	case e.TimedOut:
		msg = fmt.Sprintf("command %q timed out after %s", name, e.Timeout)
	case e.ExitCode >= 0:
		msg = fmt.Sprintf("command %q exited with status %d", name, e.ExitCode)
	case e.CPULimit > 0:
		msg = fmt.Sprintf("command %q was killed: it used up its CPU time limit of %s (SIGXCPU)", name, e.CPULimit)
	case e.Killed:
		msg = fmt.Sprintf("command %q was killed: %v", name, e.Err)
	default:
		msg = fmt.Sprintf("command %q failed: %v", name, e.Err)
	}
	if e.Output != "" {
		msg += ":\n" + e.Output
	}
	return msg
}

func (e *CommandError) Unwrap() error { return e.Err }

// ErrCircuitOpen is the cause of a snooze while an endpoint's circuit is open.
var ErrCircuitOpen = errors.New("circuit open")

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
	return fmt.Sprintf("invalid model output: %s; the answer was %q", e.Reason, textcut.ClipRunes(e.Answer, answerExcerpt))
}

// Is makes errors.Is(err, ErrInvalidOutput) true.
func (e *InvalidOutputError) Is(target error) bool { return target == ErrInvalidOutput }

// MaxErrorOutput is how many bytes of a command's output, or of a provider's
// non-JSON error body, a Result.Error keeps: the last ones.
const MaxErrorOutput = 4096
