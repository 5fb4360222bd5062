package review

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

var t0 = time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)

func state(i int, typ string, st events.Status, reason string) events.TaskState {
	return events.TaskState{ID: fmt.Sprintf("t-%06d", i), Type: typ, Subject: fmt.Sprintf("src/pkg%d/File%d.go", i%97, i),
		Status: st, Reason: reason, CreatedAt: t0.Add(time.Duration(i) * time.Second)}
}

func ids(p TaskPage) []string {
	var out []string
	for _, r := range p.Tasks {
		out = append(out, r.ID)
	}
	return out
}

func TestSearchIndex(t *testing.T) {
	x := newSearchIndex()
	x.put(state(1, "css_fix", events.StatusSucceeded, ""))
	x.put(state(2, "py_fix", events.StatusNeedsHumanReview, "trust 0.41 below threshold 0.70"))
	x.put(state(3, "css_fix", events.StatusBlocked, "Attempts exhausted"))
	x.answered("t-000001", events.Result{Approach: "Rewrote the Flexbox rules", Summary: "centred the header"})
	x.answered("t-000009", events.Result{Summary: "an answer whose state is not here yet"})
	for _, c := range []struct {
		q    TaskQuery
		want []string
	}{
		{TaskQuery{Text: "flexbox"}, []string{"t-000001"}},                          // answer text, any case
		{TaskQuery{Text: "THRESHOLD"}, []string{"t-000002"}},                        // reason
		{TaskQuery{Text: "css_"}, []string{"t-000003", "t-000001"}},                 // type, newest first
		{TaskQuery{Text: "pkg2/"}, []string{"t-000002"}},                            // subject
		{TaskQuery{Text: "000003"}, []string{"t-000003"}},                           // id
		{TaskQuery{Text: "t-", Status: events.StatusBlocked}, []string{"t-000003"}}, // with a filter
		{TaskQuery{Text: "t-", Type: "css_fix", Until: t0.Add(2 * time.Second)}, []string{"t-000001"}},
		{TaskQuery{Text: "not yet"}, nil}, // no state: not listed
		{TaskQuery{Text: "nothing like it"}, nil},
	} {
		c.q.Limit = 10
		p, err := x.search(c.q)
		if err != nil || !slices.Equal(ids(p), c.want) || p.Via != ViaSearch {
			t.Errorf("%+v: %v %v, want %v", c.q, ids(p), err, c.want)
		}
	}
	// Pages follow the cursor, each row once, newest first.
	var got []string
	q := TaskQuery{Text: "t-0", Limit: 2}
	for {
		p, err := x.search(q)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ids(p)...)
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	if !slices.Equal(got, []string{"t-000003", "t-000002", "t-000001"}) {
		t.Fatalf("paged: %v", got)
	}
	x.remove("t-000003")
	if p, _ := x.search(TaskQuery{Text: "css", Limit: 10}); !slices.Equal(ids(p), []string{"t-000001"}) {
		t.Fatalf("after a delete: %v", ids(p))
	}
	for _, bad := range []TaskQuery{{Text: "x", Cursor: "zz"}, {Text: "a\nb"}, {Text: string(make([]byte, MaxSearchLen+1))}} {
		if bad.Validate() == nil {
			t.Errorf("%+v: valid", bad)
		}
	}
}

// BenchmarkSearch100k: one search page over 100,000 tasks, each with an
// answer, matching a substring of the answer text of 1 in 100 of them; and
// one matching every task (the worst case: every row sorted).
func BenchmarkSearch100k(b *testing.B) {
	x := newSearchIndex()
	statuses := []events.Status{events.StatusSucceeded, events.StatusNeedsHumanReview, events.StatusBlocked, events.StatusRunning}
	for i := range 100_000 {
		x.put(state(i, []string{"css_fix", "py_fix", "bug_fix"}[i%3], statuses[i%4], "trust 0.41 below threshold 0.70"))
		word := "routine"
		if i%100 == 0 {
			word = "NullPointer"
		}
		x.answered(fmt.Sprintf("t-%06d", i), events.Result{Approach: "Guarded the " + word + " path in the handler",
			Summary: "The handler dereferenced a value before checking it; the fix checks it first and adds a test.", Changes: []string{"src/handler.go", "src/handler_test.go"}})
	}
	for _, c := range []struct{ name, text string }{{"1in100", "nullpointer"}, {"all", "handler"}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				p, err := x.search(TaskQuery{Text: c.text, Limit: DefaultPageSize})
				if err != nil || len(p.Tasks) != DefaultPageSize {
					b.Fatalf("%d rows, %v", len(p.Tasks), err)
				}
			}
		})
	}
}

// The index forgets the tasks the bucket expired (their keys leave no
// marker) and answers whose state never came.
func TestSearchIndexPrunesExpired(t *testing.T) {
	x := newSearchIndex()
	old, fresh := state(1, "css_fix", events.StatusSucceeded, ""), state(2, "css_fix", events.StatusSucceeded, "")
	old.UpdatedAt, fresh.UpdatedAt = t0, t0.Add(40*24*time.Hour)
	x.put(old)
	x.put(fresh)
	x.answered("t-orphan", events.Result{Summary: "an answer whose task state never came"})
	if n := x.prune(t0.Add(time.Hour), time.Now().Add(-time.Hour)); n != 1 || x.len() != 2 {
		t.Fatalf("pruned %d, %d left; want the expired task gone, the fresh one and the recent answer kept", n, x.len())
	}
	if n := x.prune(t0.Add(time.Hour), time.Now().Add(time.Hour)); n != 1 || x.len() != 1 {
		t.Fatalf("pruned %d, %d left; want the orphaned answer gone too", n, x.len())
	}
}
