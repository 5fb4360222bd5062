package review

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// errNoTask is why a bulk requeue skips a record without a task.
var errNoTask = errors.New("no task state: the input never became a task")

// bulkPage is the page size of a bulk requeue (tests lower it).
var bulkPage = MaxPageSize

// MaxBulkTargets bounds the tasks a bulk decision names one by one
// (Bulk.Targets); a type and reason (Bulk.Type, Bulk.Reason) reach any
// number.
const MaxBulkTargets = 1000

// Target is one task (or review record) a bulk decision names, with how
// many decisions it held when the reviewer looked (Item.Decisions,
// len(TaskState.Actions)): a decision another reviewer took since is named
// and left standing (DecidedError). Seen < 0 checks nothing.
type Target struct {
	ID   string `json:"id"`
	Seen int    `json:"seen_decisions"`
}

// ParseTarget reads "ID" (nothing checked) or "ID@N" (N decisions seen).
// A task id never holds '@'.
func ParseTarget(s string) (Target, error) {
	id, n, found := strings.Cut(strings.TrimSpace(s), "@")
	t := Target{ID: id, Seen: -1}
	if found {
		seen, err := strconv.Atoi(n)
		if err != nil || seen < 0 {
			return t, fmt.Errorf("%w: %q: the decisions seen after @ must be a count", ErrInvalid, s)
		}
		t.Seen = seen
	}
	if !events.ValidID(t.ID) {
		return t, fmt.Errorf("%w: task id %q", ErrInvalid, t.ID)
	}
	return t, nil
}

// Bulk is one decision taken on many items with one note.
type Bulk struct {
	// Action is resolve, reject or requeue.
	Action string `json:"action"`
	// Targets are items named one by one (the ones a reviewer ticked).
	Targets []Target `json:"targets,omitempty"`
	// Type and Reason, when either is set, also take every open item of
	// that type and review reason, beyond Targets.
	Type   string `json:"type,omitempty"`
	Reason string `json:"reason,omitempty"`
	Note   string `json:"note"`
	By     string `json:"by"`
}

// Validate reports a bulk decision that cannot be carried out as a whole.
func (b Bulk) Validate() error {
	var errs []error
	switch b.Action {
	case events.ActionResolve, events.ActionReject, events.ActionRequeue:
	default:
		errs = append(errs, fmt.Errorf("%w: action %q (resolve, reject or requeue)", ErrInvalid, b.Action))
	}
	if len(b.Targets) == 0 && b.Type == "" && b.Reason == "" {
		errs = append(errs, fmt.Errorf("%w: a bulk decision needs tasks, a type or a reason", ErrInvalid))
	}
	if len(b.Targets) > MaxBulkTargets {
		errs = append(errs, fmt.Errorf("%w: %d tasks named, at most %d (use a type and reason for more)", ErrInvalid, len(b.Targets), MaxBulkTargets))
	}
	for _, t := range b.Targets {
		if !events.ValidID(t.ID) {
			errs = append(errs, fmt.Errorf("%w: task id %q", ErrInvalid, t.ID))
		}
	}
	if b.Type != "" && !events.ValidType(b.Type) {
		errs = append(errs, fmt.Errorf("%w: task type %q", ErrInvalid, b.Type))
	}
	if err := (Filter{Reason: b.Reason}).Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := validateInput(strings.TrimSpace(b.Note), strings.TrimSpace(b.By)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// BulkItem is what a bulk decision did to one item.
type BulkItem struct {
	ID string `json:"id"`
	// Done: the decision was taken; else Why says why not, and DecidedBy
	// names the reviewer whose decision since stands (a DecidedError).
	Done      bool          `json:"done"`
	Status    events.Status `json:"status,omitempty"`
	Why       string        `json:"why,omitempty"`
	DecidedBy string        `json:"decided_by,omitempty"`
}

// BulkItemOf is the report of one item's decision.
func BulkItemOf(id string, d Decision, err error) BulkItem {
	if err == nil {
		it := BulkItem{ID: id, Done: true}
		if d.Task != nil {
			it.Status = d.Task.Status
		}
		return it
	}
	it := BulkItem{ID: id, Why: err.Error()}
	var de *DecidedError
	if errors.As(err, &de) {
		it.DecidedBy = de.Latest.By
	}
	return it
}

// DecideBulk carries out one decision on every item of b, each through the
// single-decision path (DecideSeen: the same checks, the same events, the
// same two-reviewer protection), and tells done about each as it goes.
// The named Targets go first, each with the decisions its reviewer saw;
// then, with a Type or Reason, every other open item of them (Each: with
// the decisions its listing read). An item is decided at most once. It
// stops at the first error that is not about one item (the queue could
// not be read, ctx ended).
func (c *Client) DecideBulk(ctx context.Context, b Bulk, done func(BulkItem)) error {
	if err := b.Validate(); err != nil {
		return err
	}
	b.Note, b.By = strings.TrimSpace(b.Note), strings.TrimSpace(b.By)
	met := map[string]bool{}
	for _, t := range b.Targets {
		if met[t.ID] {
			continue
		}
		met[t.ID] = true
		d, err := c.DecideSeen(ctx, b.Action, t.ID, b.Note, b.By, t.Seen)
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		done(BulkItemOf(t.ID, d, err))
	}
	if b.Type == "" && b.Reason == "" {
		return nil
	}
	return c.Each(ctx, b.Action, b.Type, b.Reason, b.Note, b.By, func(id string, d Decision, err error) {
		if !met[id] {
			met[id] = true
			done(BulkItemOf(id, d, err))
		}
	}, met)
}

// RequeueEach requeues the task of every open review item of the type and
// reason (at least one of them is required), once per task, and tells done
// about each task as it goes: skipped is nil when it was requeued, else
// why not (Each with requeue).
func (c *Client) RequeueEach(ctx context.Context, taskType, reason, note, by string, done func(id string, skipped error)) error {
	return c.Each(ctx, events.ActionRequeue, taskType, reason, note, by, func(id string, _ Decision, err error) { done(id, err) }, nil)
}

// Each takes the decision (resolve, reject or requeue) on every open review
// item of the type and reason (at least one of them is required), once per
// task, and tells done about each as it goes (err nil: taken). Each item
// is decided through DecideSeen with the decisions its listing read, so a
// decision another reviewer takes between the listing and this one is
// named (a DecidedError), never overturned. Items whose key is in skip are
// left alone (nil: none). It pages through the queue newest first (List,
// MaxPageSize items a page, following the cursor to the end: every
// matching record is read once, a human asked for all of them), so it
// holds one page in memory however many items match; an item decided here
// has a decision after its older records, so an older page no longer
// lists them as open, and the records a task gets meanwhile are newer than
// the cursor: they are not decided again. It stops at the first error that
// is not about one task (the queue could not be read, ctx ended).
func (c *Client) Each(ctx context.Context, action, taskType, reason, note, by string, done func(id string, d Decision, err error), skip map[string]bool) error {
	if taskType == "" && reason == "" {
		return fmt.Errorf("%w: a bulk %s needs a type or a reason (or both)", ErrInvalid, action)
	}
	if err := validateInput(note, by); err != nil {
		return err
	}
	f := Filter{Type: taskType, Reason: reason, Limit: bulkPage}
	left := map[string]bool{} // an item whose decision failed, met again at an older record
	for {
		q, err := c.List(ctx, f)
		if err != nil {
			return err
		}
		seen := map[string]bool{} // a task with two open records on the page
		for _, it := range q.Items {
			if seen[it.Key] || left[it.Key] || skip[it.Key] {
				continue
			}
			seen[it.Key] = true
			var d Decision
			switch {
			case it.TaskID == "" && action == events.ActionRequeue:
				err = errNoTask
			case it.TaskID == "":
				d, err = c.DecideSeen(ctx, action, it.Key, note, by, -1) // the record alone
			default:
				d, err = c.DecideSeen(ctx, action, it.TaskID, note, by, it.Decisions)
			}
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				left[it.Key] = true
			}
			done(it.Key, d, err)
		}
		if q.Next == "" {
			return nil
		}
		f.Cursor = q.Next
	}
}
