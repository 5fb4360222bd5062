package review_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
)

// A bulk decision takes each item through the single-decision path: the
// items a reviewer ticked, with the decisions each held when listed, then
// every other open item of the type and reason. A decision another
// reviewer took since is named and stands.
func TestDecideBulk(t *testing.T) {
	s := newSeeded(t)
	reviewtest.FileQueue(t, s.srv.JS, 100)
	gated, _ := walk(t, s.rc, review.Filter{Type: "css_fix", Reason: events.ReviewGated})
	if len(gated) < 10 {
		t.Fatalf("%d open gated css_fix items, want at least 10", len(gated))
	}
	// Alice ticks the first five as listed; Bob resolves the second
	// meanwhile.
	var ticked []review.Target
	for _, it := range gated[:5] {
		ticked = append(ticked, review.Target{ID: it.TaskID, Seen: it.Decisions})
	}
	if _, err := s.rc.Resolve(bg, gated[1].TaskID, "fixed by hand", "bob"); err != nil {
		t.Fatal(err)
	}
	var got []review.BulkItem
	b := review.Bulk{Action: events.ActionReject, Targets: ticked, Type: "css_fix", Reason: events.ReviewGated, Note: "obsolete after the rewrite", By: "alice"}
	if err := s.rc.DecideBulk(bg, b, func(it review.BulkItem) { got = append(got, it) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(gated) {
		t.Fatalf("reported %d items, want %d (each open gated css_fix item once)", len(got), len(gated))
	}
	for i, it := range got {
		switch {
		case i == 1:
			if it.Done || it.DecidedBy != "bob" || it.ID != gated[1].TaskID {
				t.Errorf("the item Bob resolved: %+v, want it refused naming bob", it)
			}
		case !it.Done || it.Status != events.StatusFailed:
			t.Errorf("item %d: %+v, want rejected", i, it)
		}
	}
	st, err := s.tasks.Get(bg, gated[1].TaskID)
	if err != nil || st.Status != events.StatusSucceeded {
		t.Fatalf("Bob's resolve was overturned: %s %v", st.Status, err)
	}
	if left, _ := walk(t, s.rc, review.Filter{Type: "css_fix", Reason: events.ReviewGated}); len(left) != 0 {
		t.Fatalf("%d gated css_fix items still open", len(left))
	}

	// Rejected input has no task: a bulk resolve closes its records, a
	// bulk requeue skips them.
	var requeued []review.BulkItem
	if err := s.rc.DecideBulk(bg, review.Bulk{Action: events.ActionRequeue, Reason: events.ReviewRejected, Note: "again", By: "alice"}, func(it review.BulkItem) { requeued = append(requeued, it) }); err != nil {
		t.Fatal(err)
	}
	if len(requeued) == 0 || slices.ContainsFunc(requeued, func(it review.BulkItem) bool { return it.Done }) {
		t.Fatalf("a bulk requeue of rejected input: %+v, want every record skipped", requeued)
	}
	var resolved []review.BulkItem
	if err := s.rc.DecideBulk(bg, review.Bulk{Action: events.ActionResolve, Reason: events.ReviewRejected, Note: "resubmitted fixed", By: "alice"}, func(it review.BulkItem) { resolved = append(resolved, it) }); err != nil {
		t.Fatal(err)
	}
	if len(resolved) != len(requeued) || slices.ContainsFunc(resolved, func(it review.BulkItem) bool { return !it.Done }) {
		t.Fatalf("a bulk resolve of rejected input: %+v", resolved)
	}

	for _, bad := range []review.Bulk{
		{Action: "cancel", Type: "css_fix", Note: "n", By: "a"},
		{Action: events.ActionResolve, Note: "n", By: "a"},
		{Action: events.ActionResolve, Type: "css_fix", By: "a"},
		{Action: events.ActionResolve, Targets: []review.Target{{ID: "bad id"}}, Note: "n", By: "a"},
		{Action: events.ActionResolve, Reason: "Bad!", Note: "n", By: "a"},
	} {
		if err := s.rc.DecideBulk(bg, bad, func(review.BulkItem) { t.Errorf("%+v acted", bad) }); !errors.Is(err, review.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", bad, err)
		}
	}
}

func TestParseTarget(t *testing.T) {
	for in, want := range map[string]review.Target{"t-1": {ID: "t-1", Seen: -1}, "t-1@0": {ID: "t-1", Seen: 0}, " t_2@3 ": {ID: "t_2", Seen: 3}} {
		if got, err := review.ParseTarget(in); err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "@1", "t@", "t@-1", "t@x", "a b", "t@1@2"} {
		if _, err := review.ParseTarget(in); !errors.Is(err, review.ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", in, err)
		}
	}
}
