package web_test

import (
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

func TestAPITasksExplorer(t *testing.T) {
	s := newSeeded(t)
	ids := func(p review.TaskPage) string {
		var out []string
		for _, r := range p.Tasks {
			out = append(out, r.ID)
		}
		return strings.Join(out, " ")
	}
	code, body := s.do("GET", "/api/tasks", "", "")
	if p := decode[review.TaskPage](t, body); code != 200 || ids(p) != "run-1 gtd-1 blk-1" || p.Next != "" {
		t.Fatalf("%d %s", code, body)
	}
	code, body = s.do("GET", "/api/tasks?status=running&type=css_fix", "", "")
	if p := decode[review.TaskPage](t, body); code != 200 || ids(p) != "run-1" || p.Tasks[0].Status != events.StatusRunning {
		t.Fatalf("%d %s", code, body)
	}
	// A status a task reaches with a record is found through the records.
	code, body = s.do("GET", "/api/tasks?status=blocked", "", "")
	if p := decode[review.TaskPage](t, body); code != 200 || ids(p) != "blk-1" || p.Via != review.ViaRecords || p.Next != "" || p.Partial {
		t.Fatalf("status blocked: %d %s", code, body)
	}
	code, body = s.do("GET", "/api/tasks?status=needs_human_review&type=css_fix", "", "")
	if p := decode[review.TaskPage](t, body); code != 200 || ids(p) != "gtd-1" || p.Via != review.ViaRecords {
		t.Fatalf("status needs_human_review: %d %s", code, body)
	}
	code, body = s.do("GET", "/tasks?status=blocked", "", "")
	if code != 200 || !strings.Contains(body, `data-task="blk-1"`) || !strings.Contains(body, "by the record that made the task blocked") || strings.Contains(body, `id="partial"`) {
		t.Fatalf("the explorer page filtered by blocked: %d\n%s", code, body)
	}
	code, body = s.do("GET", "/api/tasks?limit=2", "", "")
	p := decode[review.TaskPage](t, body)
	if code != 200 || ids(p) != "run-1 gtd-1" || p.Next == "" {
		t.Fatalf("%d %s", code, body)
	}
	code, body = s.do("GET", "/api/tasks?limit=2&cursor="+p.Next, "", "")
	if p := decode[review.TaskPage](t, body); code != 200 || ids(p) != "blk-1" || p.Next != "" {
		t.Fatalf("second page: %d %s", code, body)
	}
	code, body = s.do("GET", "/api/tasks?subject=src/gtd-1.css&since=2000-01-01", "", "")
	if p := decode[review.TaskPage](t, body); code != 200 || ids(p) != "gtd-1" {
		t.Fatalf("by subject: %d %s", code, body)
	}
	for _, bad := range []string{"?status=zzz", "?since=yesterday", "?cursor=!!", "?limit=x", "?type=A.B"} {
		if code, body := s.do("GET", "/api/tasks"+bad, "", ""); code != 400 || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s", bad, code, body)
		}
	}

	code, body = s.do("GET", "/tasks?type=css_fix", "", "")
	// A stopped task shows why (a held one: its type's trust).
	for _, want := range []string{`data-task="run-1"`, `data-cancel="run-1"`, `data-task="blk-1"`, "needs_human_review",
		`<small class="muted reason">Blocked: css_fix trust score 0.08 below 0.15</small>`} {
		if code != 200 || !strings.Contains(body, want) {
			t.Fatalf("the explorer page lacks %s: %d", want, code)
		}
	}
	if strings.Contains(body, `data-cancel="blk-1"`) {
		t.Fatal("the explorer offers to cancel a task that ended")
	}
}

func TestAPICancel(t *testing.T) {
	s := newSeeded(t)
	code, body := s.do("POST", "/api/tasks/run-1/cancel", "application/json", `{"note":"not needed","by":"alice"}`)
	d := decode[review.Decision](t, body)
	if code != 200 || d.Task == nil || d.Task.Status != events.StatusCancelled || d.Already || !strings.Contains(d.Task.Reason, "alice") {
		t.Fatalf("cancel: %d %s", code, body)
	}
	code, body = s.do("POST", "/api/tasks/run-1/cancel", "application/json", `{"by":"bob"}`)
	if d := decode[review.Decision](t, body); code != 200 || !d.Already {
		t.Fatalf("second cancel: %d %s", code, body)
	}
	if code, body := s.do("POST", "/api/tasks/blk-1/cancel", "application/json", `{"by":"bob"}`); code != 409 {
		t.Fatalf("cancel of an ended task: %d %s", code, body)
	}
	if st, err := s.tasks.Get(bg, "run-1"); err != nil || st.Status != events.StatusCancelled || len(st.Actions) != 1 {
		t.Fatalf("state: %+v %v", st, err)
	}
	code, body = s.do("GET", "/tasks/run-1", "", "")
	if code != 200 || !strings.Contains(body, `id="payload"`) || strings.Contains(body, `id="cancel"`) || !strings.Contains(body, "CANCEL by alice") {
		t.Fatalf("task page after cancel: %d\n%s", code, body)
	}
}
