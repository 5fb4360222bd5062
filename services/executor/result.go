package executor

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
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
// The free text is capped (events.MaxApproach, MaxSummary, MaxChanges,
// MaxChange), each cut marked.
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
	return r.capped(answerCaps), nil
}

// caps bound the free text of an answer, in bytes (changes: entries).
type caps struct {
	approach, summary, changes, change, error int
}

// answerCaps are the caps of every answer (events.MaxApproach …).
var answerCaps = caps{
	approach: events.MaxApproach, summary: events.MaxSummary,
	changes: events.MaxChanges, change: events.MaxChange, error: events.MaxError,
}

// tightCaps are the caps of an answer whose Executed event would still be
// too large (MaxExecuted): what else the event holds leaves it little room.
var tightCaps = caps{approach: 512, summary: 1 << 10, changes: 8, change: 128, error: 1 << 10}

// maxModelName bounds the model name a provider or an agent reports.
const maxModelName = 256

func (r ModelResult) capped(c caps) ModelResult {
	r.Approach, r.Summary = textcut.Cut(r.Approach, c.approach), textcut.Cut(r.Summary, c.summary)
	r.Changes = textcut.List(r.Changes, c.changes, c.change)
	return r
}

// capResult cuts the free text of r to c: the answer's fields, the error
// and the model's name, whatever produced them (a model, an agent command,
// a command step, a provider's error).
func capResult(r events.Result, c caps) events.Result {
	m := ModelResult{Approach: r.Approach, Summary: r.Summary, Changes: r.Changes}.capped(c)
	r.Approach, r.Summary, r.Changes = m.Approach, m.Summary, m.Changes
	r.Error, r.Model = textcut.Cut(r.Error, c.error), textcut.Cut(r.Model, maxModelName)
	return r
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Sprintf("field %q must be %s, got %s", typeErr.Field, typeErr.Type, typeErr.Value)
	}
	return err.Error()
}
