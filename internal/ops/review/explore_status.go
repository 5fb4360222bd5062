package review

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// RecordStatuses are the statuses a task reaches only with a record on the
// stream — a review record, a stale verdict, a human's action — so a page
// filtered by one of them reads those records instead of the task index
// (see Tasks). They are rare: a scan of the index newest first would read
// far to find them.
var RecordStatuses = []events.Status{
	events.StatusHeld, events.StatusNeedsHumanReview, events.StatusBlocked, events.StatusFailed, events.StatusCancelled,
}

// statusSubjects are the subjects of the records that put a task with id
// (a wildcard: "*") in status, each the newest record of its kind: a human
// cancel and a human reject are both on dispatch.review.action.<id>, a
// pipeline's final fail and a handoff on dispatch.review.escalated.<id>;
// the task-state get tells them apart. Poison records and rejected inputs
// are not here: a poison record leaves the status the pipeline last wrote
// (a common one, found through the index), and a rejected input never
// became a task.
func statusSubjects(status events.Status, id string) []string {
	switch status {
	case events.StatusHeld: // held for trust (a wait for canaries leaves the status alone)
		return []string{events.TaskSubject(id, events.StageHeld)}
	case events.StatusNeedsHumanReview:
		return []string{events.ReviewSubject(events.ReviewGated, id)}
	case events.StatusBlocked:
		return []string{events.ReviewSubject(events.ReviewEscalated, id), events.ReviewSubject(events.ReviewStuck, id)}
	case events.StatusFailed:
		return []string{events.ReviewSubject(events.ReviewEscalated, id), events.ReviewSubject(events.ReviewAction, id)}
	case events.StatusCancelled:
		return []string{events.TaskSubject(id, events.StageCancelled), events.ReviewSubject(events.ReviewAction, id)}
	}
	return nil
}

// recordTask is the task id a record's subject names ("" for none).
func recordTask(subject string) string {
	id := ""
	if _, key, ok := events.ParseReviewSubject(subject); ok {
		id = key
	} else if tid, stage, ok := events.ParseTaskSubject(subject); ok && (stage == events.StageCancelled || stage == events.StageHeld) {
		id = tid
	}
	if !events.ValidID(id) {
		return ""
	}
	return id
}

// tasksByRecords is Tasks for a status of RecordStatuses: a page over the
// records that put tasks there, newest first, each candidate confirmed by
// its state, each task once (at its newest record).
func (c *Client) tasksByRecords(ctx context.Context, q TaskQuery, tasks *services.TaskStore, stream jetstream.Stream) (TaskPage, error) {
	page := TaskPage{Tasks: []TaskRow{}, Via: ViaRecords}
	cursor, _ := parseCursor(q.Cursor)
	// One window per subject, merged newest first: a consumer with several
	// filters makes the server test every subject of the stream against
	// them to count what is pending (dispatch.task.*.cancelled matches
	// nothing by its prefix), where one filter is looked up in its index.
	// Since bounds the records (a task's records follow its queueing);
	// Until does not (a task queued before it may have ended after it).
	var recs merged
	for _, subj := range statusSubjects(q.Status, "*") {
		w, err := openWindow(ctx, stream, span{stream: stream, filter: subj, what: "records " + subj}, cursor, q.Since, time.Time{})
		if err != nil {
			return page, err
		}
		recs.add(w)
	}
	// A record at or above the cursor was an earlier page's (none is on
	// the first).
	earlier := cursor > 0 && cursor <= stream.CachedInfo().State.LastSeq
	budget := q.Limit * StatusScanFactor
	seen := map[string]bool{}
	for len(page.Tasks) < q.Limit && page.Scanned < budget {
		r, ok, err := recs.next(ctx, min(uint64(budget-page.Scanned), uint64(q.Limit-len(page.Tasks))*2))
		if err != nil {
			return page, err
		}
		if !ok {
			break
		}
		page.Scanned++
		if r.id == "" || seen[r.id] {
			continue // not a task's record, or the task's newer record was met on this page
		}
		seen[r.id] = true
		st, err := tasks.Get(ctx, r.id)
		switch {
		case errors.Is(err, services.ErrTaskNotFound):
			continue
		case err != nil:
			return page, fmt.Errorf("task %s: %w", r.id, err)
		}
		if !matches(st, q) {
			continue
		}
		if earlier {
			newer, err := newerRecord(ctx, stream, statusSubjects(q.Status, r.id), cursor)
			if err != nil {
				return page, err
			}
			if newer {
				continue // an earlier page listed it at its newer record
			}
		}
		page.Tasks = append(page.Tasks, rowOf(st, r.seq))
	}
	if recs.left() {
		page.Next = formatCursor(recs.hi())
		page.Partial = len(page.Tasks) < q.Limit
	}
	return page, nil
}

// taskRecord is one record of a merged walk: the task its subject names and
// its stream sequence.
type taskRecord struct {
	id  string
	seq uint64
}

// merged walks several windows newest first, as one: it visits the
// newest record any of them has left, reading each window a batch at a
// time. Every record above the last one visited has been visited, in
// every window, so that record's sequence is the cursor of what is left.
type merged struct {
	ws   []*window
	bufs [][]taskRecord // read, not visited yet: oldest first
}

func (m *merged) add(w *window) {
	m.ws = append(m.ws, w)
	m.bufs = append(m.bufs, nil)
}

// next visits the newest record left, reading up to want of a window when
// its batch is used up; false when none is left.
func (m *merged) next(ctx context.Context, want uint64) (taskRecord, bool, error) {
	best := -1
	for i, w := range m.ws {
		if len(m.bufs[i]) == 0 && w.left > 0 {
			msgs, seqs, err := w.batch(ctx, want) // records are rare: usually one read of what is left
			if err != nil {
				return taskRecord{}, false, err
			}
			if len(msgs) == 0 {
				w.left = 0 // the records aged out meanwhile
			}
			for j, msg := range msgs {
				m.bufs[i] = append(m.bufs[i], taskRecord{id: recordTask(msg.Subject()), seq: seqs[j]})
			}
		}
		if n := len(m.bufs[i]); n > 0 && (best < 0 || m.bufs[i][n-1].seq > m.bufs[best][len(m.bufs[best])-1].seq) {
			best = i
		}
	}
	if best < 0 {
		return taskRecord{}, false, nil
	}
	n := len(m.bufs[best])
	r := m.bufs[best][n-1]
	m.bufs[best] = m.bufs[best][:n-1]
	m.ws[best].visit(r.seq)
	return r, true, nil
}

// left reports whether any window has records left.
func (m *merged) left() bool {
	for i, w := range m.ws {
		if w.left > 0 || len(m.bufs[i]) > 0 {
			return true
		}
	}
	return false
}

// hi is where what is left ends: below the last record visited.
func (m *merged) hi() uint64 {
	hi := uint64(0)
	for i, w := range m.ws {
		if i == 0 || w.hi < hi {
			hi = w.hi
		}
	}
	return hi
}

// matches reports whether a task's state passes the query's filters.
func matches(st events.TaskState, q TaskQuery) bool {
	switch {
	case q.Status != "" && st.Status != q.Status:
		return false
	case q.Type != "" && st.Type != q.Type:
		return false
	case q.Subject != "" && st.Subject != q.Subject:
		return false
	case !q.Since.IsZero() && st.CreatedAt.Before(q.Since):
		return false
	case !q.Until.IsZero() && !st.CreatedAt.Before(q.Until):
		return false
	}
	return true
}

// newerRecord reports whether the stream holds a message on one of the
// subjects at or after seq: one direct get per subject (the server's next
// message on a literal subject, from its per-subject index).
func newerRecord(ctx context.Context, stream jetstream.Stream, subjects []string, seq uint64) (bool, error) {
	for _, subj := range subjects {
		_, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			continue
		case err != nil:
			return false, fmt.Errorf("records of %s: %w", subj, err)
		}
		return true, nil
	}
	return false, nil
}
