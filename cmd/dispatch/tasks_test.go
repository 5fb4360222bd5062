package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
)

func TestTasksAndCancelCommands(t *testing.T) {
	m := reviewtest.Start(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("never answered")}
	}, reviewtest.Options{})
	m.Model.Started = make(chan openaitest.Request, 2)
	m.Model.Block = make(chan struct{})
	m.Model.Cancelled = make(chan openaitest.Request, 2)
	defer close(m.Model.Block)
	c := newCLI(t, m)
	for _, s := range []events.Submit{{ID: "ls-1", Type: "css_fix", Subject: "a.css"}, {ID: "ls-2", Type: "py_fix", Subject: "b.py"}} {
		m.Submit(s) // one at a time: queued (and listed) in this order
		select {
		case <-m.Model.Started:
		case <-time.After(reviewtest.Patience):
			t.Fatal("the model was never called")
		}
	}

	out := c.ok("tasks")
	if i, j := strings.Index(out, "ls-2"), strings.Index(out, "ls-1"); i < 0 || j < 0 || i > j || !strings.Contains(out, "running") {
		t.Fatalf("tasks:\n%s", out)
	}
	if out := c.ok("ls", "-type", "py_fix"); !strings.Contains(out, "ls-2") || strings.Contains(out, "ls-1") {
		t.Fatalf("ls -type py_fix:\n%s", out)
	}
	out = c.ok("tasks", "-limit", "1", "-since", "1h")
	next, found := strings.CutPrefix(out[strings.Index(out, "older: "):], "older: dispatch ")
	if !strings.Contains(out, "ls-2") || strings.Contains(out, "ls-1") || !found {
		t.Fatalf("first page:\n%s", out)
	}
	if out := c.ok(strings.Fields(strings.TrimSpace(next))...); !strings.Contains(out, "ls-1") || strings.Contains(out, "ls-2") || strings.Contains(out, "older:") {
		t.Fatalf("dispatch %s:\n%s", next, out)
	}

	if out := c.ok("cancel", "ls-2", "-note", "wrong file"); !strings.Contains(out, "ls-2: cancelled by tester@") {
		t.Fatalf("cancel said %q", out)
	}
	select {
	case <-m.Model.Cancelled:
	case <-time.After(reviewtest.Patience):
		t.Fatal("the model's request was never cancelled")
	}
	if out := c.ok("cancel", "ls-2"); !strings.Contains(out, "already cancelled") {
		t.Fatalf("second cancel said %q", out)
	}
	var p review.TaskPage
	if err := json.Unmarshal([]byte(c.ok("tasks", "-status", "cancelled", "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Tasks) != 1 || p.Tasks[0].ID != "ls-2" || !strings.Contains(p.Tasks[0].Reason, "wrong file") {
		t.Fatalf("tasks -status cancelled: %+v", p)
	}
	if _, err := c.run("cancel"); err == nil {
		t.Error("cancel without an id was accepted")
	}
	if _, err := c.run("tasks", "-status", "sleeping"); err == nil {
		t.Error("an unknown status was accepted")
	}
}

// A page filtered by status that stopped at its read bound says so, with
// the command for the next page.
func TestPrintTasksSaysWhenAPageStoppedEarly(t *testing.T) {
	var b strings.Builder
	printTasks(&b, review.TaskPage{Tasks: []review.TaskRow{}, Next: "2s", Scanned: 200, Via: review.ViaIndex, Partial: true},
		[]string{"-status", "pending", "-limit", "10"})
	for _, want := range []string{"(no task matches)", "stopped early, after reading 200 index entries", "at most 20 per task", "older: dispatch tasks -status pending -limit 10 -cursor 2s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	printTasks(&b, review.TaskPage{Tasks: []review.TaskRow{{ID: "x", Status: events.StatusBlocked}}, Next: "9", Scanned: 40, Via: review.ViaRecords, Partial: true},
		[]string{"-status", "blocked", "-limit", "2"})
	if !strings.Contains(b.String(), "after reading 40 records") {
		t.Errorf("records page:\n%s", b.String())
	}
	b.Reset()
	printTasks(&b, review.TaskPage{Tasks: []review.TaskRow{{ID: "x"}}, Next: "9", Scanned: 1, Via: review.ViaIndex}, nil)
	if strings.Contains(b.String(), "stopped early") {
		t.Errorf("a full page says it stopped early:\n%s", b.String())
	}
}
