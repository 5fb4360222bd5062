package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/services"
)

// Limits of one page of the task explorer.
const (
	// DefaultPageSize is the page size when a query names none.
	DefaultPageSize = 50
	// MaxPageSize bounds a query's Limit.
	MaxPageSize = 500
	// StatusScanFactor bounds a page filtered by status: it reads at most
	// Limit × StatusScanFactor index entries (status is the task's current
	// state, not a token of the index), and ends early with a cursor when
	// fewer tasks of that status were among them.
	StatusScanFactor = 20
)

// Statuses are the task statuses a query may filter by.
var Statuses = []events.Status{
	events.StatusPending, events.StatusVerifying, events.StatusRunning, events.StatusParked,
	events.StatusSucceeded, events.StatusCancelled, events.StatusNeedsHumanReview, events.StatusBlocked, events.StatusFailed,
}

// TaskQuery selects tasks for the explorer. The zero value is the newest
// DefaultPageSize tasks.
type TaskQuery struct {
	// ID finds one task by its id (the other filters are then ignored).
	ID string
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
	if _, err := parseCursor(q.Cursor); err != nil {
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
	// Seq is the stream sequence of the task's index entry.
	Seq uint64 `json:"seq,omitempty"`
}

// TaskPage is one page of tasks, newest first.
type TaskPage struct {
	Tasks []TaskRow `json:"tasks"`
	// Next is the cursor of the next (older) page; "" when there is none.
	Next string `json:"next,omitempty"`
	// Scanned is how many index entries the page read.
	Scanned int `json:"scanned"`
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
// n task-state gets. Filtered by status, a page reads at most
// n × StatusScanFactor entries (and their states), and ends with a cursor
// where it stopped when fewer matched. Search by id is one get.
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
	tasks, err := c.taskStore(ctx)
	if err != nil {
		return TaskPage{}, err
	}
	page := TaskPage{Tasks: []TaskRow{}}
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
	info := stream.CachedInfo()
	ix := index{stream: stream, filter: events.IndexFilterFor(q.Type, q.Subject)}
	// Entries are read from [lo, hi), newest first.
	lo, hi := max(info.State.FirstSeq, 1), info.State.LastSeq+1
	if cur, _ := parseCursor(q.Cursor); cur > 0 && cur < hi {
		hi = cur
	}
	if !q.Until.IsZero() {
		s, err := ix.seqAt(ctx, q.Until)
		if err != nil {
			return page, err
		}
		hi = min(hi, s)
	}
	if !q.Since.IsZero() {
		s, err := ix.seqAt(ctx, q.Since)
		if err != nil {
			return page, err
		}
		lo = max(lo, s)
	}
	if hi <= lo {
		return page, nil
	}
	above, err := ix.pending(ctx, hi) // entries at or after hi
	if err != nil {
		return page, err
	}
	total, err := ix.pending(ctx, lo)
	if err != nil {
		return page, err
	}
	left := total - above // entries in [lo, hi)
	budget := q.Limit
	if q.Status != "" {
		budget = q.Limit * StatusScanFactor
	}
	for left > 0 && len(page.Tasks) < q.Limit && page.Scanned < budget {
		want := min(uint64(budget-page.Scanned), uint64(q.Limit-len(page.Tasks))*4, left)
		if q.Status == "" {
			want = min(uint64(q.Limit-len(page.Tasks)), left)
		}
		start, err := ix.start(ctx, lo, hi, above, want)
		if err != nil {
			return page, err
		}
		entries, err := ix.read(ctx, start, hi, want)
		if err != nil {
			return page, err
		}
		if len(entries) == 0 {
			break // the entries aged out meanwhile
		}
		for i := len(entries) - 1; i >= 0 && len(page.Tasks) < q.Limit && page.Scanned < budget; i-- {
			e := entries[i]
			page.Scanned++
			hi, above, left = e.seq, above+1, left-1
			if e.ID == "" || (q.Subject != "" && e.Subject != q.Subject) {
				continue // undecodable, or another subject with the same key
			}
			st, err := tasks.Get(ctx, e.ID)
			switch {
			case errors.Is(err, services.ErrTaskNotFound):
				st = events.TaskState{ID: e.ID, Type: e.Type, Subject: e.Subject, CreatedAt: e.SubmittedAt}
			case err != nil:
				return page, fmt.Errorf("task %s: %w", e.ID, err)
			}
			if q.Status != "" && st.Status != q.Status {
				continue
			}
			page.Tasks = append(page.Tasks, rowOf(st, e.seq))
		}
	}
	if left > 0 {
		page.Next = formatCursor(hi)
	}
	return page, nil
}

func rowOf(st events.TaskState, seq uint64) TaskRow {
	return TaskRow{
		ID: st.ID, Type: st.Type, Subject: st.Subject, Status: st.Status, Attempts: st.Attempts,
		TokensIn: st.TokensIn, TokensOut: st.TokensOut, Cost: st.Cost, Reason: st.Reason,
		SubmittedAt: st.CreatedAt, UpdatedAt: st.UpdatedAt, Seq: seq,
	}
}

// The cursor is the stream sequence below which the next page starts, in
// base 36: opaque to callers, stable across pages (new tasks do not shift it).
func formatCursor(seq uint64) string { return strconv.FormatUint(seq, 36) }

func parseCursor(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 36, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%w: cursor %q", ErrInvalid, s)
	}
	return n, nil
}

// index reads the task index entries of one filter.
type index struct {
	stream jetstream.Stream
	filter string
}

type indexEntry struct {
	events.IndexEntry
	seq uint64
}

// probe creates a consumer of the filter at a start position, returns what
// the server says about it, and deletes it: the server computes NumPending
// (entries from the start on) from its per-subject index, no message moves.
func (ix index) probe(ctx context.Context, cfg jetstream.ConsumerConfig) (*jetstream.ConsumerInfo, error) {
	cfg.FilterSubject = ix.filter
	cfg.AckPolicy = jetstream.AckNonePolicy
	cfg.MemoryStorage = true
	cfg.InactiveThreshold = 30 * time.Second // cleans up after a failed delete
	cons, err := ix.stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("task index: %w", err)
	}
	info := cons.CachedInfo()
	_ = ix.stream.DeleteConsumer(context.WithoutCancel(ctx), info.Name)
	return info, nil
}

// pending is how many entries have a sequence at or after seq.
func (ix index) pending(ctx context.Context, seq uint64) (uint64, error) {
	info, err := ix.probe(ctx, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq})
	if err != nil {
		return 0, err
	}
	return info.NumPending, nil
}

// seqAt is the first sequence stored at or after t (after the last one
// when none is).
func (ix index) seqAt(ctx context.Context, t time.Time) (uint64, error) {
	info, err := ix.probe(ctx, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t})
	if err != nil {
		return 0, err
	}
	return info.Delivered.Stream + 1, nil
}

// start finds the sequence in [lo, hi) where the newest want entries
// before hi begin, above being the entries at or after hi: a galloping
// search down from hi, then a binary search, each step one pending count.
// When fewer than want entries lie in [lo, hi), it returns lo.
func (ix index) start(ctx context.Context, lo, hi, above, want uint64) (uint64, error) {
	count := func(s uint64) (uint64, error) {
		n, err := ix.pending(ctx, s)
		if n < above {
			return 0, err // entries aged out meanwhile
		}
		return n - above, err
	}
	// Galloping: [low, high) holds the answer; count(high) < want.
	high, step := hi, want
	low := lo
	for {
		if hi-lo <= step {
			break
		}
		s := hi - step
		n, err := count(s)
		if err != nil {
			return 0, err
		}
		if n >= want {
			low = s
			break
		}
		high, step = s, step*2
	}
	if low == lo {
		n, err := count(lo)
		if err != nil || n <= want {
			return lo, err
		}
	}
	// Binary search: the largest s in [low, high) with count(s) >= want.
	for high-low > 1 {
		mid := low + (high-low)/2
		n, err := count(mid)
		if err != nil {
			return 0, err
		}
		if n >= want {
			low = mid
		} else {
			high = mid
		}
	}
	return low, nil
}

// read returns up to want entries from start, below hi, oldest first.
func (ix index) read(ctx context.Context, start, hi, want uint64) ([]indexEntry, error) {
	cons, err := ix.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject: ix.filter, AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("task index: %w", err)
	}
	defer func() { _ = ix.stream.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name) }()
	batch, err := cons.FetchNoWait(int(want))
	if err != nil {
		return nil, fmt.Errorf("task index: %w", err)
	}
	var out []indexEntry
	for msg := range batch.Messages() {
		meta, err := msg.Metadata()
		if err != nil || meta.Sequence.Stream >= hi {
			continue
		}
		e := indexEntry{seq: meta.Sequence.Stream}
		if json.Unmarshal(msg.Data(), &e.IndexEntry) != nil || !events.ValidID(e.ID) {
			e.IndexEntry = events.IndexEntry{} // not an entry intake wrote: read, then skipped
		}
		out = append(out, e)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return nil, fmt.Errorf("task index: %w", err)
	}
	return out, nil
}
