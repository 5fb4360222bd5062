package executor

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// ModelResult is the structured answer the model is asked for.
type ModelResult struct {
	// Status is events.OutcomeSuccess or events.OutcomeFailure.
	Status string `json:"status"`
	// Approach is what the model tried; required.
	Approach string   `json:"approach"`
	Summary  string   `json:"summary,omitempty"`
	Changes  []string `json:"changes,omitempty"`
}

// ParseResult reads a model's answer. The JSON object may be wrapped in a
// ```json fence or surrounded by prose: the text from the first "{" to the
// last "}" is decoded. Unknown fields are ignored; status (case and
// surrounding space ignored) must be success or failure and approach must not
// be empty. The error is an *InvalidOutputError saying what is wrong.
func ParseResult(content string) (ModelResult, error) {
	var r ModelResult
	if strings.TrimSpace(content) == "" {
		return r, &InvalidOutputError{Reason: "the answer is empty", Answer: content}
	}
	start, end := strings.IndexByte(content, '{'), strings.LastIndexByte(content, '}')
	if start < 0 || end < start {
		return r, &InvalidOutputError{Reason: "no JSON object in the answer", Answer: content}
	}
	if err := json.Unmarshal([]byte(content[start:end+1]), &r); err != nil {
		return ModelResult{}, &InvalidOutputError{Reason: "malformed JSON: " + describeJSONError(err), Answer: content}
	}
	r.Status = strings.ToLower(strings.TrimSpace(r.Status))
	r.Approach = strings.TrimSpace(r.Approach)
	var problems []string
	switch r.Status {
	case events.OutcomeSuccess, events.OutcomeFailure:
	case "":
		problems = append(problems, `"status" is missing (want "success" or "failure")`)
	default:
		problems = append(problems, fmt.Sprintf(`"status" %q is not "success" or "failure"`, r.Status))
	}
	if r.Approach == "" {
		problems = append(problems, `"approach" is missing`)
	}
	if problems != nil {
		return ModelResult{}, &InvalidOutputError{Reason: strings.Join(problems, "; "), Answer: content}
	}
	return r, nil
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Sprintf("field %q must be %s, got %s", typeErr.Field, typeErr.Type, typeErr.Value)
	}
	return err.Error()
}
