package review

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
)

// Answer is what the model answered in one attempt, read from its
// task.executed event: approach, summary, changes, error, model, tokens,
// cost and how long the call took. The task page (/tasks/ID) and `dispatch
// status -v` show these.
type Answer struct {
	events.Result
	Pass    int         `json:"pass"`
	Attempt int         `json:"attempt"`
	Rung    events.Rung `json:"rung,omitempty"`
	Step    string      `json:"step,omitempty"`
	// At is when the answer was stored on the stream.
	At time.Time `json:"at"`
}

// AnswerOf reads the answer an entry of a task's timeline holds: false
// unless it is a task.executed event that decodes.
func AnswerOf(e timeline.Entry) (Answer, bool) {
	if e.Stage != events.StageExecuted {
		return Answer{}, false
	}
	var ex events.Executed
	if json.Unmarshal(e.Data, &ex) != nil {
		return Answer{}, false
	}
	return Answer{Result: ex.Result, Pass: ex.Run.Pass, Attempt: ex.Run.Attempt, Rung: ex.Run.Rung, Step: ex.Run.Step, At: e.Time}, true
}

// PayloadOf reads the task's payload from an entry of its timeline: false
// unless it is the task's first event — queued, or verified for a type
// without a verifier — with a payload.
func PayloadOf(e timeline.Entry) (json.RawMessage, bool) {
	if e.Stage != events.StageQueued && e.Stage != events.StageVerified {
		return nil, false
	}
	var q events.Queued
	if json.Unmarshal(e.Data, &q) != nil || len(q.Task.Payload) == 0 {
		return nil, false
	}
	return q.Task.Payload, true
}

// Answers are every answer in a task's timeline (Timeline), in order.
func Answers(entries []timeline.Entry) []Answer {
	out := []Answer{}
	for _, e := range entries {
		if a, ok := AnswerOf(e); ok {
			out = append(out, a)
		}
	}
	return out
}

// Payload is the task's payload as its first event holds it (nil when the
// task has none, or the event aged out).
func Payload(entries []timeline.Entry) json.RawMessage {
	for _, e := range entries {
		if p, ok := PayloadOf(e); ok {
			return p
		}
	}
	return nil
}

// IndentPayload is a payload for people: indented JSON, else as it is.
func IndentPayload(p json.RawMessage) string {
	var buf bytes.Buffer
	if json.Indent(&buf, p, "", "  ") == nil {
		return buf.String()
	}
	return string(p)
}
