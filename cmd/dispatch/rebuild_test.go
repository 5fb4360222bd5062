package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"dispatchmesh/events"
	"dispatchmesh/internal/openaitest"
	"dispatchmesh/internal/review/reviewtest"
	"dispatchmesh/internal/task"
)

// Issue 9 end to end: a task whose queued event no later stage can decode
// (what an intake without a depth limit made of a payload nested 9,999
// levels deep) is dead-lettered by the verifier. Review lists it and can
// act on it; rebuild reports that one event and replays the rest.
func TestUndecodableEventIsReviewableAndRebuildSkipsIt(t *testing.T) {
	m := reviewtest.Start(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("fixed")}
	}, reviewtest.Options{})
	c := newCLI(t, m)
	m.Submit(events.Submit{ID: "fine-1", Type: "css_fix", Subject: "a.css"})
	m.WaitStage("fine-1", events.StageSucceeded, 1)

	injectUndecodableTask(t, m, "deep-1")
	m.WaitStage("deep-1", "review.poison", 1)

	out, err := c.run("rebuild")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(err.Error(), "1 events could not be decoded and were skipped") {
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
	for _, want := range []string{"replayed ", "skipped (undecodable): dispatch.task.deep-1.queued (seq ", "exceeded max depth"} {
		if !strings.Contains(out, want) {
			t.Errorf("rebuild output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "fine-1") {
		t.Errorf("the rest of the stream was not replayed as it was:\n%s", out)
	}
	out, err = c.run("rebuild", "-o", "json")
	var report struct {
		Skipped []struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Error   string `json:"error"`
		} `json:"skipped"`
	}
	if jerr := json.Unmarshal([]byte(out), &report); jerr != nil || err == nil || len(report.Skipped) != 1 ||
		report.Skipped[0].Subject != events.TaskSubject("deep-1", events.StageQueued) || report.Skipped[0].Seq == 0 {
		t.Fatalf("rebuild -o json: %v, %v\n%s", err, jerr, out)
	}

	show := c.ok("review", "show", "deep-1")
	for _, want := range []string{"stopped by poison: undecodable dispatch.task.deep-1.queued", "resolve, reject (dispatch review", "requeue  not possible"} {
		if !strings.Contains(show, want) {
			t.Errorf("review show lacks %q:\n%s", want, show)
		}
	}
	if _, err := c.run("review", "requeue", "deep-1", "-note", "again"); err == nil || !strings.Contains(err.Error(), "cannot requeue task deep-1: none of its events") {
		t.Fatalf("requeue: %v", err)
	}
	c.ok("review", "resolve", "deep-1", "-note", "fixed the payload by hand")
	if st := m.State("deep-1"); st.Status != events.StatusSucceeded {
		t.Fatalf("after resolve: %s", st.Status)
	}
}

// injectUndecodableTask does what intake did before it checked nesting:
// create the task, then publish its queued event — here nested 10,001
// levels deep, past what Go's decoder accepts — without Dispatch-Pass, as
// events were then.
func injectUndecodableTask(t *testing.T, m *reviewtest.Mesh, id string) {
	t.Helper()
	ctx := context.Background()
	tk := events.Task{ID: id, Type: "css_fix", Subject: "a.css", SubmittedAt: time.Now().UTC()}
	if _, _, err := m.Tasks.Create(ctx, task.New(tk)); err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat("[", 9999) + strings.Repeat("]", 9999)
	msg := nats.NewMsg(events.TaskSubject(id, events.StageQueued))
	msg.Header.Set(events.HeaderEvent, events.EventQueued)
	msg.Header.Set(events.HeaderTaskID, id)
	msg.Data = []byte(`{"task":{"id":"` + id + `","type":"css_fix","subject":"a.css","payload":` + deep + `},"run":{"pass":1,"attempt":1}}`)
	if _, err := m.Srv.JS.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
}
