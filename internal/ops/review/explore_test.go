package review_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// explorerMesh runs intake alone (tasks stay pending) on a real server.
func explorerMesh(t *testing.T) (*natstest.Server, *review.Client) {
	t.Helper()
	srv := natstest.Start(t)
	nc, _ := srv.Connect(t)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		done <- mesh.Run(ctx, mesh.Options{
			NC: nc, Provision: true, Services: []string{mesh.Intake}, Log: quiet, Instance: "test",
			ServiceConcurrency: map[string]int{mesh.Intake: 1}, // queue order = submission order
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mesh stopped with %v", err)
		}
	})
	rc, err := review.New(review.Config{JS: srv.JS, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close) // before the mesh and the server stop
	return srv, rc
}

func submitN(t *testing.T, srv *natstest.Server, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		typ, subject := "css_fix", fmt.Sprintf("src/b-%d.css", i)
		if i%2 == 1 {
			typ = "py_fix"
		}
		if i%3 == 0 {
			subject = "src/a.css"
		}
		data, _ := json.Marshal(events.Submit{ID: fmt.Sprintf("t%02d", i), Type: typ, Subject: subject})
		if _, err := srv.JS.Publish(bg, events.SubmitSubject(typ), data); err != nil {
			t.Fatal(err)
		}
	}
}

// waitListed waits until the explorer lists n tasks.
func waitListed(t *testing.T, rc *review.Client, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, reviewtest.Patience)
	defer cancel()
	for {
		p, err := rc.Tasks(ctx, review.TaskQuery{Limit: review.MaxPageSize})
		if err == nil && len(p.Tasks) == n {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("explorer never listed %d tasks: %d, %v", n, len(p.Tasks), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// all follows the cursor to the end and returns the ids, checking that an
// unfiltered page reads no more entries than it lists.
func all(t *testing.T, rc *review.Client, q review.TaskQuery) []string {
	t.Helper()
	var ids []string
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatalf("cursor never ends: %v", ids)
		}
		p, err := rc.Tasks(bg, q)
		if err != nil {
			t.Fatal(err)
		}
		if q.ID == "" && q.Status == "" && q.Subject == "" && p.Scanned != len(p.Tasks) {
			t.Fatalf("page read %d index entries for %d tasks", p.Scanned, len(p.Tasks))
		}
		if q.Limit > 0 && len(p.Tasks) > q.Limit {
			t.Fatalf("page of %d tasks, limit %d", len(p.Tasks), q.Limit)
		}
		for _, r := range p.Tasks {
			ids = append(ids, r.ID)
		}
		if p.Next == "" {
			return ids
		}
		q.Cursor = p.Next
	}
}

func ids(idx ...int) []string {
	out := make([]string, 0, len(idx))
	for _, i := range idx {
		out = append(out, fmt.Sprintf("t%02d", i))
	}
	return out
}

func newestFirst(n int, keep func(int) bool) []string {
	var out []int
	for i := n - 1; i >= 0; i-- {
		if keep(i) {
			out = append(out, i)
		}
	}
	return ids(out...)
}

func TestTaskExplorerListsFiltersAndPages(t *testing.T) {
	srv, rc := explorerMesh(t)
	submitN(t, srv, 0, 15)
	waitListed(t, rc, 15)
	mid := time.Now()
	submitN(t, srv, 15, 40)
	waitListed(t, rc, 40)
	every := func(int) bool { return true }

	for _, c := range []struct {
		name string
		q    review.TaskQuery
		want []string
	}{
		{"everything", review.TaskQuery{}, newestFirst(40, every)},
		{"pages of 7", review.TaskQuery{Limit: 7}, newestFirst(40, every)},
		{"pages of 1", review.TaskQuery{Limit: 1}, newestFirst(40, every)},
		{"type", review.TaskQuery{Type: "py_fix", Limit: 4}, newestFirst(40, func(i int) bool { return i%2 == 1 })},
		{"subject", review.TaskQuery{Subject: "src/a.css", Limit: 3}, newestFirst(40, func(i int) bool { return i%3 == 0 })},
		{"type and subject", review.TaskQuery{Type: "css_fix", Subject: "src/a.css", Limit: 2}, newestFirst(40, func(i int) bool { return i%6 == 0 })},
		{"since", review.TaskQuery{Since: mid, Limit: 6}, newestFirst(40, func(i int) bool { return i >= 15 })},
		{"until", review.TaskQuery{Until: mid, Limit: 6}, newestFirst(15, every)},
		{"type until", review.TaskQuery{Type: "css_fix", Until: mid}, newestFirst(15, func(i int) bool { return i%2 == 0 })},
		{"unknown type", review.TaskQuery{Type: "nothing"}, nil},
		{"by id", review.TaskQuery{ID: "t07", Type: "css_fix"}, ids(7)},
		{"unknown id", review.TaskQuery{ID: "nope"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := all(t, rc, c.q); !slices.Equal(got, c.want) {
				t.Fatalf("got  %v\nwant %v", got, c.want)
			}
		})
	}

	// Status is the task's current state: cancel three, then filter.
	for _, id := range []string{"t03", "t10", "t31"} {
		if _, err := rc.Cancel(bg, id, "not needed", "alice"); err != nil {
			t.Fatal(err)
		}
	}
	if got := all(t, rc, review.TaskQuery{Status: events.StatusCancelled, Limit: 2}); !slices.Equal(got, ids(31, 10, 3)) {
		t.Fatalf("cancelled: %v", got)
	}
	pending := newestFirst(40, func(i int) bool { return i != 3 && i != 10 && i != 31 })
	if got := all(t, rc, review.TaskQuery{Status: events.StatusPending, Limit: 5}); !slices.Equal(got, pending) {
		t.Fatalf("pending: got %v\nwant %v", got, pending)
	}

	// A page's rows carry the state; the cursor is stable while tasks arrive.
	p, err := rc.Tasks(bg, review.TaskQuery{Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Tasks[0]; r.ID != "t39" || r.Type != "py_fix" || r.Status != events.StatusPending || r.SubmittedAt.IsZero() {
		t.Fatalf("first row = %+v", r)
	}
	submitN(t, srv, 40, 45)
	waitListed(t, rc, 45)
	p2, err := rc.Tasks(bg, review.TaskQuery{Limit: 5, Cursor: p.Next})
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{p2.Tasks[0].ID, p2.Tasks[4].ID}; !slices.Equal(got, ids(34, 30)) {
		t.Fatalf("second page after new tasks arrived starts %v, want t34…t30", got)
	}

	for _, q := range []review.TaskQuery{
		{Cursor: "!!"}, {Status: "sleeping"}, {Type: "a.b"}, {Limit: review.MaxPageSize + 1},
		{Since: mid, Until: mid.Add(-time.Second)}, {ID: "a.b"},
	} {
		if _, err := rc.Tasks(bg, q); !errors.Is(err, review.ErrInvalid) {
			t.Errorf("query %+v: %v, want ErrInvalid", q, err)
		}
	}
}
