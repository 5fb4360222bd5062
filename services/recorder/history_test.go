package recorder_test

import (
	"context"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Outages, refusals and the deployment's faults are recorded on the task
// but never enter its subject's history: three of them would start the
// subject's next task on PIVOT and crowd its real failures out of the
// prompt. What the model did on the subject does enter it.
func TestOnlyTheModelsOutcomesEnterTheSubjectsHistory(t *testing.T) {
	h := recorderOn(t, nil)
	ctx := context.Background()
	for i, res := range []events.Result{
		failed(events.ErrorClassTransient, "provider unavailable: 503"),
		failed(events.ErrorClassAuth, "deployment: the API key was refused (401)"),
		failed(events.ErrorClassRefused, "refused: identical to a request that already failed"),
		failed(events.ErrorClassConfig, `deployment: the command "claude" cannot run`),
		failed(events.ErrorClassTask, "the selector is generated at build time"),
	} {
		tk := events.Task{ID: string(rune('a' + i)), Type: "css_fix", Subject: "app.css"}
		h.handle(executed(t, tk, 1, 1, events.RungRefine, res))
		if st, err := h.tasks.Get(ctx, tk.ID); err != nil || len(st.History) != 1 {
			t.Fatalf("task %s: %d attempts recorded (%v), want 1", tk.ID, len(st.History), err)
		}
	}
	rec, err := h.hist.Recent(ctx, "css_fix", "app.css")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Outcomes) != 1 || len(rec.Failures) != 1 || rec.Outcomes[0].Error != "the selector is generated at build time" {
		t.Fatalf("history of app.css: %d outcomes, %d failures %+v; want only the model's failure", len(rec.Outcomes), len(rec.Failures), rec.Outcomes)
	}
}
