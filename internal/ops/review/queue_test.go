package review_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// newestFirstOf is the sequences of the filed records kept, newest first.
func newestFirstOf(filed []reviewtest.Filed, keep func(reviewtest.Filed) bool) []uint64 {
	var out []uint64
	for i := len(filed) - 1; i >= 0; i-- {
		if keep(filed[i]) {
			out = append(out, filed[i].Seq)
		}
	}
	return out
}

// walk follows f's cursor to the end and returns every item and every
// page, checking what each page says it read.
func walk(t *testing.T, rc *review.Client, f review.Filter) ([]review.Item, []review.Queue) {
	t.Helper()
	var items []review.Item
	var pages []review.Queue
	for {
		if len(pages) > 10_000 {
			t.Fatalf("the cursor never ends (%+v)", f)
		}
		q, err := rc.List(bg, f)
		if err != nil {
			t.Fatal(err)
		}
		limit := f.Limit
		if limit == 0 {
			limit = review.DefaultPageSize
		}
		switch {
		case len(q.Items) > limit:
			t.Fatalf("page %d: %d items, limit %d", len(pages), len(q.Items), limit)
		case q.Scanned > limit*review.QueueScanFactor:
			t.Fatalf("page %d read %d records, bound %d", len(pages), q.Scanned, limit*review.QueueScanFactor)
		case !f.Filtered() && q.Scanned != len(q.Items):
			t.Fatalf("unfiltered page %d read %d records for %d items", len(pages), q.Scanned, len(q.Items))
		}
		items, pages = append(items, q.Items...), append(pages, q)
		if q.Next == "" {
			return items, pages
		}
		f.Cursor = q.Next
	}
}

func seqsOf(items []review.Item) []uint64 {
	out := make([]uint64, len(items))
	for i, it := range items {
		out[i] = it.Seq
	}
	return out
}

// scrape reads the gauge once.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	m := gauges(t, reg)
	if m["dispatch_review_queue_up"] != 1 {
		t.Fatalf("dispatch_review_queue_up 0: %v", m)
	}
	return m
}

// The queue of 5,000 groups of review records (5,250 records: gated,
// escalated, poison, stuck, rejected; a third handled by a human; some
// tasks gated again after a requeue), published straight to the stream
// with their task states: every page, cursor and filter lists exactly the
// records it should, says how many it read, and the gauge counts exactly
// the open items.
func TestQueueOfManyRecords(t *testing.T) {
	s := newSeeded(t)
	msgs := reviewtest.FileQueue(t, s.srv.JS, 5000) // records and decisions
	var filed []reviewtest.Filed                    // the records
	byKeySeq := map[uint64]reviewtest.Filed{}
	for _, f := range msgs {
		byKeySeq[f.Seq] = f
		if !f.Decision() {
			filed = append(filed, f)
		}
	}
	if len(msgs) != 7083 || len(filed) != 5250 || len(byKeySeq) != 7083 {
		t.Fatalf("filed %d records and %d decisions (%d sequences)", len(filed), len(msgs)-len(filed), len(byKeySeq))
	}
	open := func(f reviewtest.Filed) bool { return f.Open && !f.Answered }

	// The gauge: exactly the open items per reason (answered rejections
	// left out), as the filed model says.
	g := review.NewQueueGaugeConfig(s.rc, review.QueueGaugeConfig{MinInterval: -1})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(g)
	want := map[string]float64{
		"dispatch_review_queue_up":        1,
		"dispatch_review_queue/escalated": 1333, "dispatch_review_queue/gated": 1250, "dispatch_review_queue/poison": 334,
		"dispatch_review_queue/rejected": 167, "dispatch_review_queue/stuck": 166,
	}
	model := map[string]float64{"dispatch_review_queue_up": 1}
	for _, r := range review.Reasons {
		model["dispatch_review_queue/"+r] = 0
	}
	for _, f := range filed {
		if open(f) {
			model["dispatch_review_queue/"+f.Reason]++
		}
	}
	if !maps.Equal(model, want) {
		t.Fatalf("the filed model says %v, want %v", model, want)
	}
	if got := scrape(t, reg); !maps.Equal(got, want) {
		t.Fatalf("gauge %v, want %v", got, want)
	}

	t.Run("open queue", func(t *testing.T) {
		items, pages := walk(t, s.rc, review.Filter{})
		if got, want := seqsOf(items), newestFirstOf(filed, open); !slices.Equal(got, want) {
			t.Fatalf("%d open items listed, want %d", len(got), len(want))
		}
		// Walked to the end, every record and decision was read once.
		read := 0
		for _, p := range pages {
			read += p.Scanned
		}
		if read != 7083 {
			t.Fatalf("the pages read %d messages, want 7083", read)
		}
		// The first page read the newest messages down to its 50th open
		// record.
		n, seen := 0, 0
		for i := len(msgs) - 1; n < review.DefaultPageSize; i-- {
			seen++
			if !msgs[i].Decision() && open(msgs[i]) {
				n++
			}
		}
		if pages[0].Scanned != seen {
			t.Fatalf("the first page read %d records, want %d", pages[0].Scanned, seen)
		}
		// What a page lists is what the gauge counts.
		counted := map[string]float64{"dispatch_review_queue_up": 1}
		for _, r := range review.Reasons {
			counted["dispatch_review_queue/"+r] = 0
		}
		for _, it := range items {
			if !it.Open() {
				t.Fatalf("a handled item in the open queue: %+v", it)
			}
			counted["dispatch_review_queue/"+it.Reason]++
		}
		if !maps.Equal(counted, want) {
			t.Fatalf("the open queue lists %v, the gauge %v", counted, want)
		}
	})

	t.Run("reason, handled included", func(t *testing.T) {
		f := review.Filter{Reason: events.ReviewGated, All: true, Limit: 200}
		items, _ := walk(t, s.rc, f)
		if got, want := seqsOf(items), newestFirstOf(filed, func(f reviewtest.Filed) bool { return f.Reason == events.ReviewGated }); !slices.Equal(got, want) {
			t.Fatalf("%d gated items, want %d", len(got), len(want))
		}
		for _, it := range items {
			m := byKeySeq[it.Seq]
			handled := ""
			if it.Handled != nil {
				handled = it.Handled.Action
			}
			if it.Key != m.Key || handled != m.Handled || it.TaskID != m.Key || it.Type != m.Type || it.Status == "" {
				t.Fatalf("item %+v (handled %q), filed %+v", it.Record, handled, m)
			}
		}
	})

	t.Run("type and reason", func(t *testing.T) {
		items, _ := walk(t, s.rc, review.Filter{Type: "py_fix", Reason: events.ReviewEscalated, Limit: 100})
		want := newestFirstOf(filed, func(f reviewtest.Filed) bool {
			return open(f) && f.Type == "py_fix" && f.Reason == events.ReviewEscalated
		})
		if got := seqsOf(items); !slices.Equal(got, want) || len(want) != 667 {
			t.Fatalf("%d open escalated py_fix items, want %d (667)", len(got), len(want))
		}
	})

	t.Run("answered rejections", func(t *testing.T) {
		items, _ := walk(t, s.rc, review.Filter{Reason: events.ReviewRejected, All: true, Answered: true, Limit: 75})
		want := newestFirstOf(filed, func(f reviewtest.Filed) bool { return f.Reason == events.ReviewRejected })
		if got := seqsOf(items); !slices.Equal(got, want) || len(want) != 500 {
			t.Fatalf("%d rejections, want %d (500)", len(got), len(want))
		}
		for _, it := range items {
			if review.AnsweredRejection(it.Record) != byKeySeq[it.Seq].Answered || it.TaskID != "" || it.Type == "" {
				t.Fatalf("rejection %+v, filed %+v", it.Record, byKeySeq[it.Seq])
			}
		}
		if items, _ := walk(t, s.rc, review.Filter{Reason: events.ReviewRejected}); len(items) != 167 {
			t.Fatalf("%d open rejections not answered, want 167", len(items))
		}
	})

	t.Run("age", func(t *testing.T) {
		stream, err := s.srv.JS.Stream(bg, services.Stream)
		if err != nil {
			t.Fatal(err)
		}
		at := func(seq uint64) time.Time {
			raw, err := stream.GetMsg(bg, seq)
			if err != nil {
				t.Fatal(err)
			}
			return raw.Time
		}
		k := len(msgs) / 2
		for !at(msgs[k-1].Seq).Before(at(msgs[k].Seq)) {
			k++ // two messages stored in the same instant: cut between others
		}
		old := s.now
		defer func() { s.now = old }()
		s.now = at(msgs[k].Seq).Add(time.Hour)
		items, pages := walk(t, s.rc, review.Filter{Age: time.Hour, All: true, Answered: true, Limit: 500})
		want := newestFirstOf(msgs[k:], func(f reviewtest.Filed) bool { return !f.Decision() })
		read := 0
		for _, p := range pages {
			read += p.Scanned
		}
		if got := seqsOf(items); !slices.Equal(got, want) || read != len(msgs)-k {
			t.Fatalf("%d records in the last hour (%d messages read), want %d (%d)", len(got), read, len(want), len(msgs)-k)
		}
		items, _ = walk(t, s.rc, review.Filter{Reason: events.ReviewPoison, Age: time.Hour, Limit: 30})
		want = newestFirstOf(msgs[k:], func(f reviewtest.Filed) bool { return open(f) && f.Reason == events.ReviewPoison })
		if got := seqsOf(items); !slices.Equal(got, want) {
			t.Fatalf("%d open poison records in the last hour, want %d", len(got), len(want))
		}
	})

	t.Run("cursor stays put", func(t *testing.T) {
		first, err := s.rc.List(bg, review.Filter{Limit: 50})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 { // newer records arrive between the pages
			id := fmt.Sprintf("late-%d", i)
			base := events.Base{Task: events.Task{ID: id, Type: "css_fix", Subject: "s"}, Run: events.Run{Pass: 1, Attempt: 1}}
			s.publish(events.ReviewSubject(events.ReviewGated, id), events.EventGated, nil, events.Gated{Base: base})
			s.put(events.TaskState{ID: id, Type: "css_fix", Subject: "s", Status: events.StatusNeedsHumanReview, Pass: 1})
		}
		second, err := s.rc.List(bg, review.Filter{Limit: 50, Cursor: first.Next})
		if err != nil {
			t.Fatal(err)
		}
		want := newestFirstOf(filed, open)
		if got := seqsOf(append(first.Items, second.Items...)); !slices.Equal(got, want[:100]) {
			t.Fatalf("pages after new records: %v…, want %v…", got[:3], want[:3])
		}
		if fresh, _ := s.rc.List(bg, review.Filter{Limit: 5}); fresh.Items[0].Key != "late-4" {
			t.Fatalf("the newest page starts at %s, want late-4", fresh.Items[0].Key)
		}
	})

	// The gauge reads what is new: five more gated.
	want["dispatch_review_queue/gated"] += 5
	if got := scrape(t, reg); !maps.Equal(got, want) {
		t.Fatalf("gauge after 5 more gated: %v, want %v", got, want)
	}

	// A bulk requeue acts on every open item of its filter, a page at a
	// time (40 items a page here: five pages), each task once.
	review.SetBulkPage(t, 40)
	var requeued []string
	err := s.rc.RequeueEach(bg, "py_fix", events.ReviewStuck, "the skip budget was too small", "alice", func(id string, skipped error) {
		if skipped != nil {
			t.Errorf("skipped %s: %v", id, skipped)
		}
		requeued = append(requeued, id)
	})
	if err != nil {
		t.Fatal(err)
	}
	var wantIDs []string
	for _, f := range filed {
		if open(f) && f.Reason == events.ReviewStuck && f.Type == "py_fix" {
			wantIDs = append(wantIDs, f.Key)
		}
	}
	slices.Reverse(wantIDs) // newest first
	if !slices.Equal(requeued, wantIDs) || len(wantIDs) != 166 {
		t.Fatalf("requeued %d tasks, want the %d open stuck py_fix ones, newest first", len(requeued), len(wantIDs))
	}
	want["dispatch_review_queue/stuck"] = 0
	if got := scrape(t, reg); !maps.Equal(got, want) {
		t.Fatalf("gauge after the bulk requeue: %v, want %v", got, want)
	}
	if items, _ := walk(t, s.rc, review.Filter{Reason: events.ReviewStuck}); len(items) != 0 {
		t.Fatalf("%d stuck items still open", len(items))
	}
	res, err := s.rc.RequeueWhere(bg, "py_fix", events.ReviewStuck, "again", "alice")
	if err != nil || len(res.Requeued)+len(res.Skipped) != 0 {
		t.Fatalf("a second bulk requeue found %+v, %v", res, err)
	}

	// One decision closes every open record of its task (a gated task
	// filed twice has one open record); rejected input is closed by its
	// record's decision.
	if _, err := s.rc.Reject(bg, "r18", "obsolete", "bob"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.rc.Resolve(bg, "seq-17", "submitted again by hand", "bob"); err != nil {
		t.Fatal(err)
	}
	want["dispatch_review_queue/gated"]--
	want["dispatch_review_queue/rejected"]--
	if got := scrape(t, reg); !maps.Equal(got, want) {
		t.Fatalf("gauge after two decisions: %v, want %v", got, want)
	}

	for _, f := range []review.Filter{{Limit: review.MaxPageSize + 1}, {Limit: -1}, {Cursor: "!!"}, {Reason: "Bad!"}} {
		if _, err := s.rc.List(bg, f); !errors.Is(err, review.ErrInvalid) {
			t.Errorf("filter %+v: %v, want ErrInvalid", f, err)
		}
	}
}
