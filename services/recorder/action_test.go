package recorder_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dispatchmesh/events"
	"dispatchmesh/internal/task"
	"dispatchmesh/services"
	"dispatchmesh/services/recorder"
)

// act stores a human's action in the task's state, as the review client
// does before it publishes it, and returns the action's message.
func (h *harness) act(id, typ string, status events.Status, action string, delivered int) (*services.Msg, events.Action) {
	h.t.Helper()
	ctx := context.Background()
	a := events.Action{TaskID: id, Action: action, Note: "a note", By: "ann@host", At: now.Add(90 * time.Second)}
	if _, err := h.tasks.Get(ctx, id); err != nil {
		st := task.New(events.Task{ID: id, Type: typ, Subject: id + ".css", SubmittedAt: now})
		st.Status = status
		if _, _, err := h.tasks.Create(ctx, st); err != nil {
			h.t.Fatal(err)
		}
	}
	if _, err := h.tasks.Update(ctx, id, func(st *events.TaskState, _ bool) error { *st = task.Act(*st, a); return nil }); err != nil {
		h.t.Fatal(err)
	}
	return actionMsg(h.t, a, delivered), a
}

func actionMsg(t *testing.T, a events.Action, delivered int) *services.Msg {
	t.Helper()
	data, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return &services.Msg{Subject: events.ReviewSubject(events.ReviewAction, a.TaskID), Data: data, Seq: 1, Delivered: delivered, Time: a.At}
}

func TestRecorderConsumesTheReviewActions(t *testing.T) {
	h := recorderOn(t, nil)
	spec := h.rec.Spec()
	if len(spec.Filters) != 2 || spec.Filters[1] != "dispatch.review.action.*" || spec.Filters[1] != recorder.ActionFilter {
		t.Fatalf("filters %v, want the executed stage and dispatch.review.action.*", spec.Filters)
	}
}

// Every task a human ends is counted once, by="human", with the time
// since its submission; a requeue, a redelivery, a void action (the state
// does not hold it) and a record without a task count nothing.
func TestHumanEndsAreCountedOnce(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := recorderOn(t, reg)

	resolve, _ := h.act("t-resolve", "css_fix", events.StatusBlocked, events.ActionResolve, 1)
	reject, _ := h.act("t-reject", "css_fix", events.StatusNeedsHumanReview, events.ActionReject, 1)
	cancel, _ := h.act("t-cancel", "css_fix", events.StatusRunning, events.ActionCancel, 1)
	requeue, _ := h.act("t-requeue", "css_fix", events.StatusBlocked, events.ActionRequeue, 1)
	for _, m := range []*services.Msg{resolve, reject, cancel, requeue} {
		if outs := h.handle(m); len(outs) != 0 {
			t.Fatalf("%s: %d outputs, want none", m.Subject, len(outs))
		}
	}
	// A redelivery counts nothing again.
	again := *cancel
	again.Delivered = 2
	h.handle(&again)
	// A void action: published, then reverted from the state.
	void := actionMsg(t, events.Action{TaskID: "t-resolve", Action: events.ActionReject, By: "bob@host", At: now.Add(time.Hour)}, 1)
	h.handle(void)
	// A decision on rejected input: no task state.
	h.handle(actionMsg(t, events.Action{TaskID: "seq-42", Action: events.ActionReject, By: "bob@host", At: now}, 1))
	// Not an action at all.
	h.handle(&services.Msg{Subject: events.ReviewSubject(events.ReviewAction, "junk"), Data: []byte("{"), Delivered: 1})

	want := `
# HELP dispatch_tasks_finished_total Tasks that ended, by type, status (succeeded, blocked, failed, needs_human_review, cancelled) and who ended them (by: recorder, gate, verifier, human).
# TYPE dispatch_tasks_finished_total counter
dispatch_tasks_finished_total{by="human",status="cancelled",type="css_fix"} 1
dispatch_tasks_finished_total{by="human",status="failed",type="css_fix"} 1
dispatch_tasks_finished_total{by="human",status="succeeded",type="css_fix"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "dispatch_tasks_finished_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "dispatch_task_seconds"); n != 3 {
		t.Errorf("dispatch_task_seconds has %d series, want 3", n)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "dispatch_task_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if c, s := m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum(); c != 1 || s != 90 {
				t.Errorf("dispatch_task_seconds%v: count %d, sum %v; want 1 and 90 (from the submission to the action)", m.GetLabel(), c, s)
			}
		}
	}
}
