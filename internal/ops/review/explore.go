package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Limits of one page of the task explorer.
const (
	// DefaultPageSize is the page size when a query names none.
	DefaultPageSize = 50
	// MaxPageSize bounds a query's Limit.
	MaxPageSize = 500
	// StatusScanFactor bounds a page filtered by status: it reads at most
	// Limit × StatusScanFactor index entries (status is the task's current
	// state, not a token of the index) — or, for a status in
	// RecordStatuses, records — and ends early with a cursor, Partial set,
	// when fewer tasks of that status were among them.
	StatusScanFactor = 20
)

// How a page found its tasks (TaskPage.Via).
const (
	// ViaIndex: the task index, newest queued first.
	ViaIndex = "index"
	// ViaRecords: the records on the stream that put a task in a status of
	// RecordStatuses, newest record first (see Tasks).
	ViaRecords = "records"
	// ViaSearch: the search index of the live feed (TaskQuery.Text).
	ViaSearch = "search"
)

// Statuses are the task statuses a query may filter by.
var Statuses = []events.Status{
	events.StatusPending, events.StatusVerifying, events.StatusRunning, events.StatusParked, events.StatusHeld,
	events.StatusSucceeded, events.StatusCancelled, events.StatusNeedsHumanReview, events.StatusBlocked, events.StatusFailed,
}

// TaskQuery selects tasks for the explorer. The zero value is the newest
// DefaultPageSize tasks.
type TaskQuery struct {
	// ID finds one task by its id (the other filters are then ignored,
	// unless Text is set).
	ID string
	// Text searches the id, type, subject, reason and latest answer of
	// every task for this text, as a substring, case-insensitive, with the
	// other filters applied too: the search index of the live feed (Live),
	// in memory, answers it.
	Text string
	// Type, Subject (exact) and Status keep tasks that have them.
	Type, Subject string
	Status        events.Status
	// Since and Until keep tasks queued in [Since, Until) (zero: open).
	Since, Until time.Time
	// Cursor continues a listing: the Next of the previous page.
	Cursor string
	// Limit is the page size (default DefaultPageSize, at most MaxPageSize).
	Limit int
}

// Validate reports a query that cannot mean what the caller meant.
func (q TaskQuery) Validate() error {
	var errs []error
	if q.ID != "" && !events.ValidID(q.ID) {
		errs = append(errs, fmt.Errorf("%w: task id %q", ErrInvalid, q.ID))
	}
	if q.Type != "" && !events.ValidType(q.Type) {
		errs = append(errs, fmt.Errorf("%w: task type %q", ErrInvalid, q.Type))
	}
	if q.Status != "" && !slices.Contains(Statuses, q.Status) {
		errs = append(errs, fmt.Errorf("%w: status %q (the statuses are %v)", ErrInvalid, q.Status, Statuses))
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Since.Before(q.Until) {
		errs = append(errs, fmt.Errorf("%w: since %s is not before until %s", ErrInvalid, q.Since.Format(time.RFC3339), q.Until.Format(time.RFC3339)))
	}
	if q.Limit < 0 || q.Limit > MaxPageSize {
		errs = append(errs, fmt.Errorf("%w: limit %d (1-%d)", ErrInvalid, q.Limit, MaxPageSize))
	}
	if len(q.Text) > MaxSearchLen || strings.ContainsFunc(q.Text, unicode.IsControl) {
		errs = append(errs, fmt.Errorf("%w: search text: at most %d printable characters", ErrInvalid, MaxSearchLen))
	}
	if q.Text != "" && q.Cursor != "" {
		if _, _, err := parseSearchCursor(q.Cursor); err != nil {
			errs = append(errs, err)
		}
	} else if _, err := parseCursor(q.Cursor); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// TaskRow is one task of a page.
type TaskRow struct {
	ID          string        `json:"id"`
	Type        string        `json:"type"`
	Subject     string        `json:"subject"`
	Status      events.Status `json:"status"` // "" when the task has no state (yet, or any more)
	Attempts    int           `json:"attempts"`
	TokensIn    int           `json:"tokens_in"`
	TokensOut   int           `json:"tokens_out"`
	Cost        float64       `json:"cost"`
	Reason      string        `json:"reason,omitempty"`
	SubmittedAt time.Time     `json:"submitted_at"`
	UpdatedAt   time.Time     `json:"updated_at,omitzero"`
	// Seq is the stream sequence of the task's index entry — on a page
	// Via records, of the record that put the task in its status.
	Seq uint64 `json:"seq,omitempty"`
}

// TaskPage is one page of tasks, newest first.
type TaskPage struct {
	Tasks []TaskRow `json:"tasks"`
	// Next is the cursor of the next (older) page; "" when there is none.
	Next string `json:"next,omitempty"`
	// Scanned is how many index entries (Via index) or records (Via
	// records) the page read.
	Scanned int `json:"scanned"`
	// Via says where the page found its tasks: ViaIndex or ViaRecords.
	Via string `json:"via"`
	// Partial is true when a page filtered by status stopped at its read
	// bound (Limit × StatusScanFactor) with fewer than Limit tasks: older
	// tasks of that status may remain, and Next continues the search.
	Partial bool `json:"partial,omitempty"`
}

// Tasks lists tasks newest first, one page at a time.
//
// The index: intake files every task it queues once, on
// dispatch.index.<type>.<subject key> in the DISPATCH stream (the subject
// key is a hash of the task's subject: events.SubjectKey). Stream order is
// queue order, so newest first is descending sequence; type and subject
// are tokens, so the server filters by them; a time range is a range of
// sequences (the server maps a time to a sequence); the cursor is the
// sequence of the oldest entry the previous page read. Nothing here reads
// the stream or the task bucket as a whole.
//
// The cost of one page of n tasks: one stream info; for the sequence
// bounds, one consumer create per time bound; then a search for the
// sequence where the page's n entries begin — consumer creates whose
// NumPending the server computes from its per-subject index, no message
// read or sent: O(log2(d/n)) of them, d the distance in sequences the page
// spans (about 2 to 40); one consumer that delivers exactly the n entries;
// n task-state gets. Filtered by a common status (pending, verifying,
// running, parked, succeeded), a page reads at most n × StatusScanFactor
// entries (and their states), and ends with a cursor where it stopped, and
// Partial, when fewer matched. Search by id is one get.
//
// The statuses a task ends in when a human is needed or it was cancelled
// (RecordStatuses) are rare, so the index would be read far and wide to
// find them; instead such a page reads the records that put a task there,
// which the stream holds anyway (nothing more is published for it):
// needs_human_review ← dispatch.review.gated.<id>; blocked ←
// dispatch.review.escalated.<id> and dispatch.review.stuck.<id>; failed ←
// dispatch.review.escalated.<id> (a pipeline's final fail) and
// dispatch.review.action.<id> (a human's reject); cancelled ←
// dispatch.task.<id>.cancelled (stale) and dispatch.review.action.<id> (a
// human's cancel). The same machinery pages over those subjects newest
// first — one window per subject, merged by sequence (one consumer with
// both filters would make the server test every subject of the stream
// against them for each count: dispatch.task.*.cancelled has no prefix to
// look up) — and the cursor is a sequence, as above (Via is ViaRecords, a
// row's Seq its record's). When what is left of a window fits in the
// batch, as it usually does for such rare records, it is read with one
// consumer, without the search. Each candidate's status is confirmed with
// one task-state get, which also applies the type, subject and time
// filters (a task's queued time, CreatedAt). A task appears once, at its
// newest record on those subjects: an id already met on the page is
// skipped, and on a page after the first (below a cursor) one direct get
// per subject (one or two) asks whether the task has a record above the
// cursor, where an earlier page listed it. Such a page reads at most n ×
// StatusScanFactor records. Since bounds the records read (a task's
// records follow its queueing); Until does not (a task queued before it
// may end after it).
//
// The index lives as long as the stream keeps events (MaxAge): an older
// task is still found by its id.
func (c *Client) Tasks(ctx context.Context, q TaskQuery) (TaskPage, error) {
	if err := q.Validate(); err != nil {
		return TaskPage{}, err
	}
	if q.Limit == 0 {
		q.Limit = DefaultPageSize
	}
	if q.Text != "" {
		return c.search(ctx, q)
	}
	tasks, err := c.taskStore(ctx)
	if err != nil {
		return TaskPage{}, err
	}
	page := TaskPage{Tasks: []TaskRow{}, Via: ViaIndex}
	if q.ID != "" {
		st, err := tasks.Get(ctx, q.ID)
		switch {
		case errors.Is(err, services.ErrTaskNotFound):
			return page, nil
		case err != nil:
			return page, err
		}
		page.Tasks = append(page.Tasks, rowOf(st, 0))
		return page, nil
	}

	stream, err := c.cfg.JS.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return page, fmt.Errorf("stream %s (is the mesh provisioned?): %w", c.cfg.Stream, err)
	}
	if slices.Contains(RecordStatuses, q.Status) {
		return c.tasksByRecords(ctx, q, tasks, stream)
	}
	cursor, _ := parseCursor(q.Cursor)
	w, err := openWindow(ctx, stream, span{stream: stream, filter: events.IndexFilterFor(q.Type, q.Subject), what: "task index"}, cursor, q.Since, q.Until)
	if err != nil {
		return page, err
	}
	budget := q.Limit
	if q.Status != "" {
		budget = q.Limit * StatusScanFactor
	}
	more := func() bool { return len(page.Tasks) < q.Limit && page.Scanned < budget }
	size := func() (uint64, uint64) {
		if q.Status == "" {
			return uint64(q.Limit - len(page.Tasks)), 0
		}
		return min(uint64(budget-page.Scanned), uint64(q.Limit-len(page.Tasks))*4), 0
	}
	err = w.walk(ctx, more, size, func(msg jetstream.Msg, seq uint64) error {
		page.Scanned++
		var e events.IndexEntry
		if json.Unmarshal(msg.Data(), &e) != nil || !events.ValidID(e.ID) || (q.Subject != "" && e.Subject != q.Subject) {
			return nil // not an entry intake wrote (read, then skipped), or another subject with the same key
		}
		st, err := tasks.Get(ctx, e.ID)
		switch {
		case errors.Is(err, services.ErrTaskNotFound):
			st = events.TaskState{ID: e.ID, Type: e.Type, Subject: e.Subject, CreatedAt: e.SubmittedAt}
		case err != nil:
			return fmt.Errorf("task %s: %w", e.ID, err)
		}
		if q.Status == "" || st.Status == q.Status {
			page.Tasks = append(page.Tasks, rowOf(st, seq))
		}
		return nil
	})
	if err != nil {
		return page, err
	}
	page.Next = w.next()
	page.Partial = page.Next != "" && q.Status != "" && len(page.Tasks) < q.Limit
	return page, nil
}

// search answers a query with Text from the live feed's index, once it
// holds every task's current state.
func (c *Client) search(ctx context.Context, q TaskQuery) (TaskPage, error) {
	l, err := c.Live(ctx)
	if err != nil {
		return TaskPage{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, waitReady)
	defer cancel()
	if err := l.Ready(wctx); err != nil {
		return TaskPage{}, err
	}
	return l.index.search(q)
}

func rowOf(st events.TaskState, seq uint64) TaskRow {
	return TaskRow{
		ID: st.ID, Type: st.Type, Subject: st.Subject, Status: st.Status, Attempts: st.Attempts,
		TokensIn: st.TokensIn, TokensOut: st.TokensOut, Cost: st.Cost, Reason: st.Reason,
		SubmittedAt: st.CreatedAt, UpdatedAt: st.UpdatedAt, Seq: seq,
	}
}
