package review_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// rareSeed writes, oldest first: nine tasks that ended needing a human or
// cancelled (or were handled since), the records that put them there, then
// many succeeded tasks — the rare ones are older than every common one.
type rareSeed struct {
	*seeded
	created time.Time // the rare tasks' queued time
	after   time.Time // between the rare tasks and the common ones
}

func seedRare(t *testing.T, common int) *rareSeed {
	t.Helper()
	s := &rareSeed{seeded: newSeeded(t), created: time.Now().UTC().Add(-time.Hour)}
	rare := []struct {
		id, typ string
		status  events.Status
	}{
		{"blk-a", "css_fix", events.StatusBlocked},
		{"blk-b", "py_fix", events.StatusBlocked},
		{"blk-c", "css_fix", events.StatusBlocked}, // escalated, requeued, escalated again
		{"fail-p", "css_fix", events.StatusFailed}, // a pipeline's final fail: an escalated record
		{"fail-h", "css_fix", events.StatusFailed}, // gated, then rejected by a human
		{"res-1", "css_fix", events.StatusSucceeded},
		{"cnl-s", "css_fix", events.StatusCancelled}, // stale
		{"cnl-h", "py_fix", events.StatusCancelled},  // cancelled by a human
		{"gtd-1", "css_fix", events.StatusNeedsHumanReview},
	}
	for _, r := range rare {
		s.index(r.id, r.typ, s.created)
		s.put(events.TaskState{ID: r.id, Type: r.typ, Subject: "src/" + r.id, Status: r.status, Pass: 1, CreatedAt: s.created, UpdatedAt: s.created})
	}
	s.record(events.ReviewSubject(events.ReviewEscalated, "blk-c"), "blk-c", nil)
	s.record(events.ReviewSubject(events.ReviewAction, "blk-c"), "blk-c", &events.Action{Action: events.ActionRequeue})
	s.record(events.ReviewSubject(events.ReviewEscalated, "blk-a"), "blk-a", nil)
	s.record(events.ReviewSubject(events.ReviewStuck, "blk-b"), "blk-b", nil)
	s.record(events.ReviewSubject(events.ReviewEscalated, "fail-p"), "fail-p", nil)
	s.record(events.ReviewSubject(events.ReviewGated, "fail-h"), "fail-h", nil)
	s.record(events.ReviewSubject(events.ReviewAction, "fail-h"), "fail-h", &events.Action{Action: events.ActionReject})
	s.record(events.ReviewSubject(events.ReviewEscalated, "res-1"), "res-1", nil)
	s.record(events.ReviewSubject(events.ReviewAction, "res-1"), "res-1", &events.Action{Action: events.ActionResolve})
	s.record(events.TaskSubject("cnl-s", events.StageCancelled), "cnl-s", nil)
	s.record(events.ReviewSubject(events.ReviewAction, "cnl-h"), "cnl-h", &events.Action{Action: events.ActionCancel})
	s.record(events.ReviewSubject(events.ReviewGated, "gtd-1"), "gtd-1", nil)
	s.record(events.ReviewSubject(events.ReviewEscalated, "blk-c"), "blk-c", nil)
	s.after = time.Now().UTC()

	// The common tasks, published and stored without waiting for each ack.
	kv := "$KV." + services.BucketTasks + "."
	for i := range common {
		id := fmt.Sprintf("ok-%05d", i)
		entry, _ := json.Marshal(events.IndexEntry{ID: id, Type: "css_fix", Subject: "src/" + id, SubmittedAt: s.after})
		msg := nats.NewMsg(events.IndexSubject("css_fix", "src/"+id))
		msg.Header.Set(events.HeaderEvent, events.EventIndexed)
		msg.Data = entry
		if _, err := s.srv.JS.PublishMsgAsync(msg); err != nil {
			t.Fatal(err)
		}
		st, _ := json.Marshal(events.TaskState{ID: id, Type: "css_fix", Subject: "src/" + id, Status: events.StatusSucceeded, Pass: 1, CreatedAt: s.after})
		if _, err := s.srv.JS.PublishAsync(kv+id, st); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-s.srv.JS.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("the common tasks were not stored within a minute")
	}
	return s
}

func (s *rareSeed) index(id, typ string, at time.Time) {
	s.t.Helper()
	s.publish(events.IndexSubject(typ, "src/"+id), events.EventIndexed, nil, events.IndexEntry{ID: id, Type: typ, Subject: "src/" + id, SubmittedAt: at})
}

// record publishes a review record (an action when a is set) or a stale
// cancel, as the services and the review client do.
func (s *rareSeed) record(subject, id string, a *events.Action) {
	s.t.Helper()
	h := map[string]string{events.HeaderTaskID: id}
	if a != nil {
		a.TaskID, a.By, a.At = id, "alice", time.Now().UTC()
		s.publish(subject, events.EventAction, h, a)
		return
	}
	s.publish(subject, "test.record.v1", h, events.Escalated{Base: events.Base{Task: events.Task{ID: id, Type: "css_fix", Subject: "src/" + id}}})
}

func TestStatusFilterFindsRareOldTasks(t *testing.T) {
	s := seedRare(t, 5000)
	rc := s.rc
	page := func(q review.TaskQuery) review.TaskPage {
		t.Helper()
		p, err := rc.Tasks(bg, q)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	idsOf := func(p review.TaskPage) []string {
		out := []string{}
		for _, r := range p.Tasks {
			out = append(out, r.ID)
		}
		return out
	}

	// The three blocked tasks, older than 5,000 succeeded ones, in one
	// page: read from their six records (blk-c has two), not the index.
	p := page(review.TaskQuery{Status: events.StatusBlocked})
	if got := idsOf(p); !slices.Equal(got, []string{"blk-c", "blk-b", "blk-a"}) || p.Next != "" || p.Partial || p.Via != review.ViaRecords || p.Scanned != 6 {
		t.Fatalf("blocked: %v next %q partial %v via %s scanned %d", got, p.Next, p.Partial, p.Via, p.Scanned)
	}
	if r := p.Tasks[1]; r.Type != "py_fix" || r.Status != events.StatusBlocked || r.Subject != "src/blk-b" || r.Seq == 0 {
		t.Fatalf("row = %+v", r)
	}

	for _, c := range []struct {
		name string
		q    review.TaskQuery
		want []string
	}{
		{"blocked, pages of 1", review.TaskQuery{Status: events.StatusBlocked, Limit: 1}, []string{"blk-c", "blk-b", "blk-a"}},
		{"blocked, pages of 2", review.TaskQuery{Status: events.StatusBlocked, Limit: 2}, []string{"blk-c", "blk-b", "blk-a"}},
		{"blocked of a type", review.TaskQuery{Status: events.StatusBlocked, Type: "py_fix"}, []string{"blk-b"}},
		{"blocked of a subject", review.TaskQuery{Status: events.StatusBlocked, Subject: "src/blk-a", Limit: 1}, []string{"blk-a"}},
		{"failed: a pipeline's fail and a human's reject", review.TaskQuery{Status: events.StatusFailed, Limit: 1}, []string{"fail-h", "fail-p"}},
		{"cancelled: by a human and stale", review.TaskQuery{Status: events.StatusCancelled}, []string{"cnl-h", "cnl-s"}},
		{"cancelled of a type", review.TaskQuery{Status: events.StatusCancelled, Type: "py_fix", Limit: 1}, []string{"cnl-h"}},
		{"needs_human_review", review.TaskQuery{Status: events.StatusNeedsHumanReview}, []string{"gtd-1"}},
		{"queued before until", review.TaskQuery{Status: events.StatusBlocked, Until: s.after}, []string{"blk-c", "blk-b", "blk-a"}},
		{"queued before the rare ones", review.TaskQuery{Status: events.StatusBlocked, Until: s.created}, nil},
		{"queued since the common ones", review.TaskQuery{Status: events.StatusBlocked, Since: s.after}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := all(t, rc, c.q)
			if !slices.Equal(got, c.want) {
				t.Fatalf("got  %v\nwant %v", got, c.want)
			}
		})
	}

	// A page of one: the cursor moves down the records; blk-c's older
	// record, on the last page, is not listed again.
	var pages [][]string
	q := review.TaskQuery{Status: events.StatusBlocked, Limit: 1}
	for {
		p := page(q)
		pages = append(pages, idsOf(p))
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	if fmt.Sprint(pages) != "[[blk-c] [blk-b] [blk-a] []]" {
		t.Fatalf("pages of one: %v", pages)
	}

	// A common status keeps the index: newest first finds it at once.
	p = page(review.TaskQuery{Status: events.StatusSucceeded, Limit: 3})
	if got := idsOf(p); !slices.Equal(got, []string{"ok-04999", "ok-04998", "ok-04997"}) || p.Via != review.ViaIndex || p.Partial || p.Scanned != 3 {
		t.Fatalf("succeeded: %v via %s partial %v scanned %d", got, p.Via, p.Partial, p.Scanned)
	}
	// One that is not there says the page stopped early, and where.
	p = page(review.TaskQuery{Status: events.StatusPending, Limit: 10})
	if len(p.Tasks) != 0 || !p.Partial || p.Next == "" || p.Scanned != 10*review.StatusScanFactor {
		t.Fatalf("pending: %v partial %v next %q scanned %d", idsOf(p), p.Partial, p.Next, p.Scanned)
	}
}

// A task that gets a newer record after a page was served moves up: a
// later page (below the cursor) does not list it again at its old record.
func TestStatusFilterListsATaskOnceAcrossPages(t *testing.T) {
	s := seedRare(t, 0)
	p, err := s.rc.Tasks(bg, review.TaskQuery{Status: events.StatusBlocked, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Tasks) != 1 || p.Tasks[0].ID != "blk-c" || p.Next == "" {
		t.Fatalf("first page: %+v", p)
	}
	// blk-a is escalated again (requeued, failed again) meanwhile.
	s.record(events.ReviewSubject(events.ReviewEscalated, "blk-a"), "blk-a", nil)
	var got []string
	for q := (review.TaskQuery{Status: events.StatusBlocked, Limit: 1, Cursor: p.Next}); ; {
		p, err := s.rc.Tasks(bg, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Tasks {
			got = append(got, r.ID)
		}
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	if !slices.Equal(got, []string{"blk-b"}) {
		t.Fatalf("later pages: %v, want blk-b only (blk-a is now above the cursor, on a newer first page)", got)
	}
	if got := all(t, s.rc, review.TaskQuery{Status: events.StatusBlocked, Limit: 1}); !slices.Equal(got, []string{"blk-a", "blk-c", "blk-b"}) {
		t.Fatalf("from the top: %v", got)
	}
}
