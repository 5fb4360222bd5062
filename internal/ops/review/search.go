package review

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

// Limits of the search index.
const (
	// MaxSearchLen bounds a search text.
	MaxSearchLen = 200
	// searchAnswerLen bounds the answer text the index keeps per task (its
	// latest answer's approach, summary and changes).
	searchAnswerLen = 1024
)

// searchRow is one task in the index: what a page lists, and the
// lower-cased text a search matches.
type searchRow struct {
	row    TaskRow
	answer string    // the latest answer, clipped
	text   string    // lower-cased id, type, subject, reason and answer
	seen   time.Time // when the index last took something of it
}

func (r *searchRow) reindex() {
	r.text = strings.ToLower(r.row.ID + "\x00" + r.row.Type + "\x00" + r.row.Subject + "\x00" + r.row.Reason + "\x00" + r.answer)
}

// searchIndex holds every task's row in memory, fed by the live watch
// (Live): a search reads no server. Safe for concurrent use.
type searchIndex struct {
	mu   sync.RWMutex
	rows map[string]*searchRow
}

func newSearchIndex() *searchIndex { return &searchIndex{rows: map[string]*searchRow{}} }

// put stores a task's state.
func (x *searchIndex) put(st events.TaskState) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.rows[st.ID]
	if r == nil {
		r = &searchRow{}
		x.rows[st.ID] = r
	}
	r.row, r.seen = rowOf(st, 0), time.Now()
	r.reindex()
}

// answered stores the text of a task's latest answer (an answer may be
// read before its task's state: the row then waits for the state).
func (x *searchIndex) answered(id string, res events.Result) {
	text := strings.TrimSpace(strings.Join(append([]string{res.Approach, res.Summary}, res.Changes...), "\n"))
	if text == "" {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.rows[id]
	if r == nil {
		r = &searchRow{row: TaskRow{ID: id}}
		x.rows[id] = r
	}
	r.answer, r.seen = textcut.Clip(text, searchAnswerLen), time.Now()
	r.reindex()
}

// prune drops the rows of tasks whose state the bucket no longer holds: a
// key the bucket expires (its MaxAge) leaves no marker the feed would see.
// A state not updated since before cutoff is gone; an answer whose state
// never came, seen before orphaned, never will.
func (x *searchIndex) prune(cutoff, orphaned time.Time) (dropped int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for id, r := range x.rows {
		noState := r.row.Status == ""
		if (!noState && r.row.UpdatedAt.Before(cutoff)) || (noState && r.seen.Before(orphaned)) {
			delete(x.rows, id)
			dropped++
		}
	}
	return dropped
}

// remove drops a task whose state was deleted.
func (x *searchIndex) remove(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.rows, id)
}

func (x *searchIndex) len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.rows)
}

// searchCursor is "<queued unix nanoseconds>.<id>": the last row of a page.
func searchCursor(r TaskRow) string {
	return strconv.FormatInt(r.SubmittedAt.UnixNano(), 10) + "." + r.ID
}

func parseSearchCursor(s string) (time.Time, string, error) {
	n, id, ok := strings.Cut(s, ".")
	ns, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil || strconv.FormatInt(ns, 10) != n || !events.ValidID(id) {
		return time.Time{}, "", fmt.Errorf("%w: search cursor %q", ErrInvalid, s)
	}
	return time.Unix(0, ns).UTC(), id, nil
}

// newer orders rows newest queued first, then by id (descending).
func newer(a, b TaskRow) int {
	if c := b.SubmittedAt.Compare(a.SubmittedAt); c != 0 {
		return c
	}
	return cmp.Compare(b.ID, a.ID)
}

// search answers one page of q (q.Text set): every row whose lower-cased
// text holds the lower-cased search, that passes q's other filters, newest
// queued first.
func (x *searchIndex) search(q TaskQuery) (TaskPage, error) {
	page := TaskPage{Tasks: []TaskRow{}, Via: ViaSearch}
	var after *TaskRow
	if q.Cursor != "" {
		at, id, err := parseSearchCursor(q.Cursor)
		if err != nil {
			return page, err
		}
		after = &TaskRow{SubmittedAt: at, ID: id}
	}
	needle := strings.ToLower(q.Text)
	x.mu.RLock()
	defer x.mu.RUnlock()
	// The newest Limit+1 hits, kept sorted: a search that matches every
	// task sorts no more than a page of them.
	keep := q.Limit + 1
	hits := make([]*TaskRow, 0, keep)
	for _, r := range x.rows {
		if r.row.Status == "" && r.row.Type == "" {
			continue // an answer whose task's state is not (or no longer) here
		}
		if !strings.Contains(r.text, needle) || !q.keeps(r.row) || (after != nil && newer(*after, r.row) >= 0) {
			continue
		}
		if len(hits) == keep && newer(r.row, *hits[keep-1]) >= 0 {
			continue // older than every hit kept
		}
		i, _ := slices.BinarySearchFunc(hits, &r.row, func(a, b *TaskRow) int { return newer(*a, *b) })
		if len(hits) == keep {
			hits = hits[:keep-1]
		}
		hits = slices.Insert(hits, i, &r.row)
	}
	page.Scanned = len(x.rows)
	if len(hits) > q.Limit {
		hits = hits[:q.Limit]
		page.Next = searchCursor(*hits[len(hits)-1])
	}
	for _, r := range hits {
		page.Tasks = append(page.Tasks, *r)
	}
	return page, nil
}

// keeps applies a query's filters other than the search text to a row.
func (q TaskQuery) keeps(r TaskRow) bool {
	switch {
	case q.ID != "" && r.ID != q.ID,
		q.Type != "" && r.Type != q.Type,
		q.Subject != "" && r.Subject != q.Subject,
		q.Status != "" && r.Status != q.Status,
		!q.Since.IsZero() && r.SubmittedAt.Before(q.Since),
		!q.Until.IsZero() && !r.SubmittedAt.Before(q.Until):
		return false
	}
	return true
}
