package recorder_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
)

// What an attempt leaves in its subject's history and in its task's dead
// ends is capped: the texts cut (marked), the oldest dead end dropped
// when the task carries MaxDeadEnds already, the newest kept.
func TestRecordedTextIsCapped(t *testing.T) {
	h := recorderOn(t, nil)
	ctx := context.Background()
	tk := events.Task{ID: "t1", Type: "css_fix", Subject: "app.css"}
	var carried []events.DeadEnd
	for n := 1; n <= ladder.MaxDeadEnds; n++ {
		carried = append(carried, events.DeadEnd{Approach: fmt.Sprint("try ", n), Reason: "broken", Attempt: n, Rung: events.RungPivot})
	}
	if _, err := h.tasks.Update(ctx, tk.ID, func(st *events.TaskState, _ bool) error {
		st.ID, st.Type, st.Subject, st.Status = tk.ID, tk.Type, tk.Subject, events.StatusRunning
		st.Pass, st.Attempts, st.RoundStart, st.Rung, st.DeadEnds = 40, 39, 39, events.RungPivot, carried
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	res := failed(events.ErrorClassTask, strings.Repeat("the stack trace goes on ", 20_000))
	res.Approach = strings.Repeat("regenerate ", 300) // over events.MaxApproach: an Executed of no executor of ours
	res.Summary = strings.Repeat("s", 100<<10)
	h.handle(executed(t, tk, 40, 40, events.RungPivot, res))

	st, err := h.tasks.Get(ctx, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.DeadEnds); n != ladder.MaxDeadEnds || st.DeadEnds[0].Attempt != 2 {
		t.Fatalf("%d dead ends from attempt %d; want %d, the oldest dropped", n, st.DeadEnds[0].Attempt, ladder.MaxDeadEnds)
	}
	newest := st.DeadEnds[len(st.DeadEnds)-1]
	if newest.Attempt != 40 || len(newest.Approach) > events.MaxApproach || len(newest.Reason) > ladder.MaxDeadEndReason ||
		!strings.HasSuffix(newest.Reason, " bytes more]") {
		t.Fatalf("newest dead end: attempt %d, %d bytes of approach, %d of reason (…%q)", newest.Attempt,
			len(newest.Approach), len(newest.Reason), newest.Reason[max(0, len(newest.Reason)-30):])
	}

	rec, err := h.hist.Recent(ctx, tk.Type, tk.Subject)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Outcomes) != 1 || len(rec.Failures) != 1 {
		t.Fatalf("history: %d outcomes, %d failures", len(rec.Outcomes), len(rec.Failures))
	}
	e := rec.Outcomes[0]
	if len(e.Approach) > history.MaxApproach || len(e.Summary) > history.MaxSummary || len(e.Error) > history.MaxError ||
		!strings.HasSuffix(e.Summary, " bytes more]") || !strings.HasPrefix(e.Error, "the stack trace goes on") {
		t.Fatalf("history entry keeps %d bytes of approach, %d of summary, %d of error", len(e.Approach), len(e.Summary), len(e.Error))
	}
}
