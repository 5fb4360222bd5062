package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Describe is a one-line account of a timeline entry for people: the
// entry's summary, or for a human decision who did what and why.
func Describe(e timeline.Entry) string {
	if e.Stage != "review."+ReasonAction {
		return e.Summary()
	}
	var a events.Action
	if err := json.Unmarshal(e.Data, &a); err != nil || a.Action == "" {
		return "human action (undecodable)"
	}
	s := fmt.Sprintf("%s by %s", strings.ToUpper(a.Action), a.By)
	if a.Note != "" {
		s += fmt.Sprintf(": %q", textcut.Clip(strings.ReplaceAll(a.Note, "\n", " "), 200))
	}
	return s
}

// Who is the instance or person behind an entry: the Dispatch-Service
// header, else the event's own by field.
func Who(e timeline.Entry) string {
	if e.By != "" {
		return e.By
	}
	var v struct {
		By string `json:"by"`
	}
	_ = json.Unmarshal(e.Data, &v)
	return v.By
}

// AuditEntry is one event of a task's audit trail.
type AuditEntry struct {
	timeline.Entry
	// Who is the service instance or person behind the event.
	Who string `json:"who"`
	// Summary is the one-line account for people (Describe).
	Summary string `json:"summary"`
}

// Audit is a task's whole story as the stream holds it.
type Audit struct {
	ID string `json:"id"`
	// Task is the current state; nil for input that never became a task.
	Task   *events.TaskState `json:"task,omitempty"`
	Events []AuditEntry      `json:"events"`
	// Retention says how far back the stream remembers.
	Retention Retention `json:"retention"`
}

// Audit returns every event of the task in stream order, with who handled
// it: task events, review records and human decisions.
func (c *Client) Audit(ctx context.Context, id string) (Audit, error) {
	entries, err := c.Timeline(ctx, id)
	if err != nil {
		return Audit{}, err
	}
	tasks, err := c.taskStore(ctx)
	if err != nil {
		return Audit{}, err
	}
	a := Audit{ID: id, Events: make([]AuditEntry, 0, len(entries))}
	switch st, err := tasks.Get(ctx, id); {
	case err == nil:
		a.Task = &st
	case !errors.Is(err, services.ErrTaskNotFound):
		return Audit{}, err
	}
	if a.Task == nil && len(entries) == 0 {
		return Audit{}, fmt.Errorf("%w: %s has no state and no events on the stream (never submitted, or aged out)", ErrNotFound, id)
	}
	for _, e := range entries {
		a.Events = append(a.Events, AuditEntry{Entry: e, Who: Who(e), Summary: Describe(e)})
	}
	if a.Retention, err = c.Retention(ctx); err != nil {
		return Audit{}, err
	}
	return a, nil
}
