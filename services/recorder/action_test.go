package recorder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services/recorder"
)

// act stores a human's action in the task's state, as the review client
// does before it publishes it, and returns the action's message.
func (h *harness) act(id, typ string, status events.Status, action string) (*nats.Msg, events.Action) {
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
	return actionMsg(h.t, a), a
}

func actionMsg(t *testing.T, a events.Action) *nats.Msg {
	t.Helper()
	data, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Subject: events.ReviewSubject(events.ReviewAction, a.TaskID), Data: data}
}

func (h *harness) hear(m *nats.Msg) { h.rec.HandleAction(context.Background(), m.Subject, m.Data) }

// The recorder's durable has one filter, the executed stage; it hears the
// review actions on a subscription (queue group "recorder") when given a
// connection, and counts what they end.
func TestRecorderHearsTheReviewActions(t *testing.T) {
	h := recorderOn(t, nil)
	if spec := h.rec.Spec(); !slices.Equal(spec.Filters, []string{events.StageFilter(events.StageExecuted)}) {
		t.Fatalf("filters %v, want the executed stage alone", spec.Filters)
	}
	reg := prometheus.NewPedanticRegistry()
	rec, err := recorder.New(recorder.Config{Tasks: h.tasks, History: h.hist, Trust: h.view, Policy: policy.Static(budgeted),
		Registry: reg, NATS: h.nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rec.Close)
	m, _ := h.act("t-heard", "css_fix", events.StatusBlocked, events.ActionResolve)
	if err := h.nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 10*time.Second, "the action published counted", func() error {
		if n := testutil.CollectAndCount(reg, "dispatch_tasks_finished_total"); n != 1 {
			return fmt.Errorf("%d series", n)
		}
		return nil
	})
}

// Every task a human ends is counted once, by="human", with the time
// since its submission; a requeue, a void action (the state does not hold
// it) and a record without a task count nothing.
func TestHumanEndsAreCountedOnce(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := recorderOn(t, reg)

	resolve, _ := h.act("t-resolve", "css_fix", events.StatusBlocked, events.ActionResolve)
	reject, _ := h.act("t-reject", "css_fix", events.StatusNeedsHumanReview, events.ActionReject)
	cancel, _ := h.act("t-cancel", "css_fix", events.StatusRunning, events.ActionCancel)
	requeue, _ := h.act("t-requeue", "css_fix", events.StatusBlocked, events.ActionRequeue)
	for _, m := range []*nats.Msg{resolve, reject, cancel, requeue} {
		h.hear(m)
	}
	// A void action: published, then reverted from the state.
	h.hear(actionMsg(t, events.Action{TaskID: "t-resolve", Action: events.ActionReject, By: "bob@host", At: now.Add(time.Hour)}))
	// A decision on rejected input: no task state.
	h.hear(actionMsg(t, events.Action{TaskID: "seq-42", Action: events.ActionReject, By: "bob@host", At: now}))
	// Not an action at all.
	h.hear(&nats.Msg{Subject: events.ReviewSubject(events.ReviewAction, "junk"), Data: []byte("{")})

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
