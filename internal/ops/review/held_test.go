package review_test

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// hold writes what the gate writes for a pass it holds for trust: the
// task's state (status held) and its entry in the held index.
func (s *seeded) hold(idx *services.HeldIndex, id, typ string, since time.Time, reason string) services.HeldEntry {
	s.t.Helper()
	e := services.HeldEntry{Task: id, Type: typ, Pass: 1, Since: since, Seq: 1, Reason: reason}
	if err := idx.Put(bg, e); err != nil {
		s.t.Fatal(err)
	}
	s.put(events.TaskState{ID: id, Type: typ, Subject: id + ".css", Status: events.StatusHeld, Pass: 1, Reason: reason})
	return e
}

func heldIDs(hl review.HeldList) []string {
	var ids []string
	for _, it := range hl.Items {
		ids = append(ids, it.TaskID)
	}
	return ids
}

// The held tasks are listed from the held index, oldest first whatever
// order the gate wrote them in, by type, with the gate's reason and when
// each goes to a human; a removed entry and a task that moved on (a
// human acted) are not listed.
func TestHeldListedFromTheIndex(t *testing.T) {
	s := newSeeded(t)
	kv, err := s.srv.JS.KeyValue(bg, services.BucketHeld)
	if err != nil {
		t.Fatal(err)
	}
	idx := services.NewHeldIndex(kv)
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	why := func(typ string) string { return "Blocked: " + typ + " trust score 0.00 below 0.15" }
	s.hold(idx, "h-3", "css_fix", base.Add(3*time.Minute), why("css_fix"))
	s.hold(idx, "h-1", "css_fix", base.Add(1*time.Minute), why("css_fix"))
	s.hold(idx, "p-2", "py_fix", base.Add(2*time.Minute), why("py_fix"))
	gone := s.hold(idx, "h-0", "css_fix", base, why("css_fix"))
	if err := idx.Delete(bg, gone.Key()); err != nil { // the gate ended its hold
		t.Fatal(err)
	}
	s.hold(idx, "h-4", "css_fix", base.Add(4*time.Minute), why("css_fix"))
	s.put(events.TaskState{ID: "h-4", Type: "css_fix", Status: events.StatusFailed, Pass: 1, // a human rejected it
		Actions: []events.Action{{Action: events.ActionReject, By: "alice", At: base.Add(5 * time.Minute)}}})
	// An entry whose task state is gone (aged out) is listed from the index.
	if err := idx.Put(bg, services.HeldEntry{Task: "h-5", Type: "css_fix", Pass: 2, Since: base.Add(5 * time.Minute), Seq: 7, Reason: why("css_fix")}); err != nil {
		t.Fatal(err)
	}

	hl, err := s.rc.Held(bg, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := heldIDs(hl), []string{"h-1", "p-2", "h-3", "h-5"}; !slices.Equal(got, want) {
		t.Fatalf("held = %v, want %v (oldest first)", got, want)
	}
	if hl.Total != 5 || !hl.Complete || hl.Scanned != 6 || hl.MovedOn != 1 || hl.HoldTimeFrom != review.HoldTimeFromDefault {
		t.Fatalf("held list = total %d, complete %v, scanned %d, moved on %d, hold time from %q", hl.Total, hl.Complete, hl.Scanned, hl.MovedOn, hl.HoldTimeFrom)
	}
	it := hl.Items[0]
	if it.Type != "css_fix" || it.Pass != 1 || !it.Since.Equal(base.Add(time.Minute)) || it.Reason != why("css_fix") ||
		it.Status != events.StatusHeld || it.HoldTime != trust.DefaultHoldTime || !it.ToHuman.Equal(it.Since.Add(trust.DefaultHoldTime)) ||
		it.Note != "re-admitted when css_fix recovers" {
		t.Fatalf("item = %+v", it)
	}
	if last := hl.Items[3]; last.Status != "" || last.Pass != 2 || last.Reason != why("css_fix") {
		t.Fatalf("item without a task state = %+v", last)
	}

	// The queue's type filter: the server filters the listing by type.
	hl, err = s.rc.Held(bg, "py_fix")
	if err != nil {
		t.Fatal(err)
	}
	if got := heldIDs(hl); !slices.Equal(got, []string{"p-2"}) || hl.Total != 1 || hl.Scanned != 1 || !strings.Contains(hl.Items[0].Note, "py_fix recovers") {
		t.Fatalf("py_fix held = %v (total %d, scanned %d)", got, hl.Total, hl.Scanned)
	}
	if _, err := s.rc.Held(bg, "Bad type!"); err == nil {
		t.Fatal("a bad type was accepted")
	}

	// The hand-off time follows the type's hold_time in the policy.
	hold := policy.Duration(2 * time.Hour)
	rc, err := review.New(review.Config{JS: s.srv.JS, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Policy: policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": {HoldTime: hold}}})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	hl, err = rc.Held(bg, "")
	if err != nil {
		t.Fatal(err)
	}
	if hl.HoldTimeFrom != review.HoldTimeFromPolicy || len(hl.Items) != 4 {
		t.Fatalf("with a policy: %+v", hl)
	}
	for _, it := range hl.Items {
		want := trust.DefaultHoldTime
		if it.Type == "css_fix" {
			want = 2 * time.Hour
		}
		if it.HoldTime != want || !it.ToHuman.Equal(it.Since.Add(want)) {
			t.Errorf("%s (%s): hold time %s, to a human at %s, want %s", it.TaskID, it.Type, it.HoldTime, it.ToHuman, want)
		}
	}
}

// A listing returns the oldest HeldLimit held tasks, and counts them all.
func TestHeldListIsBounded(t *testing.T) {
	s := newSeeded(t)
	kv, err := s.srv.JS.KeyValue(bg, services.BucketHeld)
	if err != nil {
		t.Fatal(err)
	}
	idx := services.NewHeldIndex(kv)
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	n := review.HeldLimit + 5
	var want []string
	for i := range n {
		// Written newest first: the listing orders by when each was held.
		id := fmt.Sprintf("b-%03d", n-1-i)
		s.hold(idx, id, "css_fix", base.Add(time.Duration(n-1-i)*time.Second), "low trust")
	}
	for i := range review.HeldLimit {
		want = append(want, fmt.Sprintf("b-%03d", i))
	}
	hl, err := s.rc.Held(bg, "css_fix")
	if err != nil {
		t.Fatal(err)
	}
	if got := heldIDs(hl); !slices.Equal(got, want) || hl.Total != n || !hl.Complete || hl.Scanned != n {
		t.Fatalf("held: %d listed from %v, total %d, complete %v, scanned %d; want the oldest %d of %d", len(got), got[:min(len(got), 1)], hl.Total, hl.Complete, hl.Scanned, review.HeldLimit, n)
	}
	// An empty index (or type) lists nothing.
	if hl, err := s.rc.Held(bg, "py_fix"); err != nil || len(hl.Items) != 0 || hl.Total != 0 || !hl.Complete {
		t.Fatalf("py_fix: %+v, %v", hl, err)
	}
}
