package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"time"
)

// Task is one unit of work for an agent.
type Task struct {
	// ID is client-supplied or generated. Submitting the same id twice makes one task.
	ID string `json:"id"`
	// Type selects the policy: template, model, verifier, pipeline, thresholds.
	Type string `json:"type"`
	// Subject is what the task is about (a file path, a ticket, a URL). Outcome
	// history and recurring-error detection are keyed by (Type, Subject).
	Subject string `json:"subject"`
	// Payload is free JSON handed to the prompt template.
	Payload json.RawMessage `json:"payload,omitempty"`
	// MaxRetries, when > 0, lowers the task's attempt limit below its
	// type's (policy max_retries); it never raises it.
	MaxRetries int `json:"max_retries,omitempty"`
	// Priority is informational metadata for now.
	Priority int `json:"priority,omitempty"`
	// Metadata is free string metadata carried with the task.
	Metadata map[string]string `json:"metadata,omitempty"`
	// CallbackURL is the submission's callback_url (Submit.CallbackURL).
	CallbackURL string `json:"callback_url,omitempty"`
	// SubmittedAt is set by intake.
	SubmittedAt time.Time `json:"submitted_at"`
}

// Limits on submitted input. They bound what one bad client can do.
const (
	MaxSubmitBytes   = 256 << 10 // whole submit message
	MaxSubjectLen    = 1024
	MaxIDLen         = 128
	MaxTypeLen       = 64
	MaxMetadataPairs = 32
	// MaxCallbackURLLen bounds a submission's callback_url.
	MaxCallbackURLLen = 2048
)

var (
	idPattern   = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	typePattern = regexp.MustCompile(`^[a-z0-9_-]+$`)
)

// ErrInvalid marks every validation error of submitted input.
var ErrInvalid = errors.New("invalid task")

// InvalidError says what is wrong with a submission, field by field.
type InvalidError struct {
	Problems []string
}

func (e *InvalidError) Error() string {
	msg := "invalid task"
	for i, p := range e.Problems {
		if i == 0 {
			msg += ": " + p
		} else {
			msg += "; " + p
		}
	}
	return msg
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Submit is the message a client publishes on dispatch.submit.<type> (or sends
// to the dispatch.api.submit endpoint). Schema: schemas/submit.v1.json.
type Submit struct {
	ID         string            `json:"id,omitempty"`
	Type       string            `json:"type"`
	Subject    string            `json:"subject"`
	Payload    json.RawMessage   `json:"payload,omitempty"`
	MaxRetries int               `json:"max_retries,omitempty"`
	Priority   int               `json:"priority,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// CallbackURL, when set, is where the mesh POSTs the task's wait answer,
	// signed, once it settles (docs/api.md#webhooks): an absolute http or
	// https URL of at most MaxCallbackURLLen bytes. The webhook service
	// delivers only to hosts its configuration allows.
	CallbackURL string `json:"callback_url,omitempty"`
}

// DecodeSubmit parses and validates a submission. subjectType is the <type>
// token of the subject it arrived on ("" when it came through the API); when
// both are given they must agree, and a missing "type" field is taken from the
// subject. The error is an *InvalidError listing every problem found; the
// Submit returned with it holds what could be read, its ID a valid id or "".
//
// Beyond the schema it refuses what a later stage could not carry: a message
// nested deeper than MaxDepth, a string that is not valid UTF-8 (the decoder
// would silently replace it), a task that the mesh's events encode in more
// than MaxSubmitBytes. The id of a rejected message is read even when the
// message is oversized or malformed, so its review record is kept under it.
func DecodeSubmit(data []byte, subjectType string) (Submit, error) {
	var s Submit
	id, deep, problems := scanSubmit(data)
	readable := Submit{}
	if ValidID(id) {
		readable.ID = id
	}
	if len(data) > MaxSubmitBytes {
		return readable, &InvalidError{Problems: []string{fmt.Sprintf("message is %d bytes, limit is %d", len(data), MaxSubmitBytes)}}
	}
	if deep != "" {
		return readable, &InvalidError{Problems: append(problems, deep)}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return readable, &InvalidError{Problems: append(problems, "malformed JSON: "+describeJSONError(err))}
	}
	if _, err := dec.Token(); err != io.EOF {
		return readable, &InvalidError{Problems: append(problems, "malformed JSON: trailing data after the object")}
	}
	if s.Type == "" {
		s.Type = subjectType
	}
	switch {
	case s.Type == "":
		problems = append(problems, `"type" is required`)
	case len(s.Type) > MaxTypeLen || !typePattern.MatchString(s.Type):
		problems = append(problems, fmt.Sprintf(`"type" %q must be 1-%d characters of a-z, 0-9, _ or -`, s.Type, MaxTypeLen))
	case subjectType != "" && s.Type != subjectType:
		problems = append(problems, fmt.Sprintf(`"type" %q does not match the subject's type %q`, s.Type, subjectType))
	}
	if s.ID != "" && (len(s.ID) > MaxIDLen || !idPattern.MatchString(s.ID)) {
		problems = append(problems, fmt.Sprintf(`"id" %q must be 1-%d characters of A-Z, a-z, 0-9, _ or -`, s.ID, MaxIDLen))
	}
	if s.Subject == "" {
		problems = append(problems, `"subject" is required`)
	} else if len(s.Subject) > MaxSubjectLen {
		problems = append(problems, fmt.Sprintf(`"subject" is %d characters, limit is %d`, len(s.Subject), MaxSubjectLen))
	}
	if len(s.Payload) > 0 && !json.Valid(s.Payload) {
		problems = append(problems, `"payload" is not valid JSON`)
	}
	if s.MaxRetries < 0 {
		problems = append(problems, `"max_retries" must not be negative`)
	}
	if len(s.Metadata) > MaxMetadataPairs {
		problems = append(problems, fmt.Sprintf(`"metadata" has %d entries, limit is %d`, len(s.Metadata), MaxMetadataPairs))
	}
	if s.CallbackURL != "" {
		if err := CheckCallbackURL(s.CallbackURL); err != nil {
			problems = append(problems, `"callback_url" `+err.Error())
		}
	}
	if problems == nil {
		// What the mesh publishes is the task re-encoded: <, >, & and
		// U+2028/2029 in strings grow to 6 bytes each. It must fit too.
		switch enc, err := json.Marshal(s); {
		case err != nil:
			problems = append(problems, "cannot be encoded: "+err.Error())
		case len(enc) > MaxSubmitBytes:
			problems = append(problems, fmt.Sprintf("the task is %d bytes as the mesh encodes it (<, > and & are escaped as 6 bytes each), limit is %d", len(enc), MaxSubmitBytes))
		}
	}
	if problems != nil {
		if !ValidID(s.ID) {
			s.ID = ""
		}
		return s, &InvalidError{Problems: problems}
	}
	return s, nil
}

// DecodeSubmitFrom decodes a submission published on subject: the type is
// the subject's <type> token (see DecodeSubmit). A message on bare
// dispatch.submit is rejected whatever it holds: the type belongs in the
// subject, where permissions and consumers see it (the API endpoint
// dispatch.api.submit takes the type from the body instead).
func DecodeSubmitFrom(subject string, data []byte) (Submit, error) {
	taskType, ok := ParseSubmitSubject(subject)
	s, err := DecodeSubmit(data, taskType)
	if ok {
		return s, err
	}
	problems := []string{fmt.Sprintf("published on %q, which names no task type: publish on %s.<type>", subject, SubmitRoot)}
	var inv *InvalidError
	if errors.As(err, &inv) {
		problems = append(problems, inv.Problems...)
	}
	return s, &InvalidError{Problems: problems}
}

// GeneratedID is the id of a submission that did not bring one: derived from
// the message's place in the stream, so a redelivery yields the same id.
func GeneratedID(seq uint64, stored time.Time) string {
	return "t" + strconv.FormatInt(stored.UnixNano(), 36) + "-" + strconv.FormatUint(seq, 36)
}

// Task turns a valid submission into a task with the given id and time.
func (s Submit) Task(id string, at time.Time) Task {
	if s.ID != "" {
		id = s.ID
	}
	return Task{
		ID: id, Type: s.Type, Subject: s.Subject, Payload: s.Payload,
		MaxRetries: s.MaxRetries, Priority: s.Priority, Metadata: s.Metadata, CallbackURL: s.CallbackURL,
		SubmittedAt: at.UTC(),
	}
}

// ValidID reports whether id can be used as a task id (a subject token and a KV key).
func ValidID(id string) bool {
	return id != "" && len(id) <= MaxIDLen && idPattern.MatchString(id)
}

// ValidType reports whether t can be used as a task type.
func ValidType(t string) bool {
	return t != "" && len(t) <= MaxTypeLen && typePattern.MatchString(t)
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Sprintf("field %q must be %s, got %s", typeErr.Field, typeErr.Type, typeErr.Value)
	}
	return err.Error()
}
