package review_test

import (
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Human decisions are events too: after resolve, reject and a requeue that
// ran to success, rebuilding the stores from the stream finds no difference.
func TestRebuildAfterHumanActions(t *testing.T) {
	const note = "try the parent element"
	m := reviewtest.Start(t, reviewtest.FailUnless(note), reviewtest.Options{})
	for _, id := range []string{"rb-1", "rb-2", "rb-3"} {
		escalate(m, id, "bug_fix")
	}
	if _, err := m.Review.Resolve(bg, "rb-1", "fixed by hand", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Review.Reject(bg, "rb-2", "not worth it", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Review.Requeue(bg, "rb-3", note, "alice"); err != nil {
		t.Fatal(err)
	}
	m.WaitStage("rb-3", events.StageSucceeded, 1)

	stores, err := services.OpenStores(bg, m.Srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	built, err := rebuild.Replay(bg, m.Srv.JS, rebuild.Options{Policy: m.Policy})
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := rebuild.Compare(bg, rebuild.Live{Tasks: stores.Tasks, Trust: stores.Trust, History: stores.History, Held: stores.Held, JS: m.Srv.JS}, built)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Errorf("difference: %s", d)
	}
	if st := built.Tasks["rb-2"]; st == nil || st.Status != events.StatusFailed || len(st.Actions) != 1 {
		t.Fatalf("rebuilt rb-2 = %+v", st)
	}
}
