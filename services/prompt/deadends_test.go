package prompt

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
)

// shownApproaches are the approaches of the <dead_end> elements of a
// prompt, normalised.
func shownApproaches(t *testing.T, p events.Prompted) []string {
	t.Helper()
	var got []string
	for _, e := range find(parseUser(t, p.Prompt.Messages[len(p.Prompt.Messages)-1].Content), "dead_end") {
		approach, _, _ := strings.Cut(e.Text, " -- failed:")
		got = append(got, ladder.Normalize(approach))
	}
	return got
}

func normalized(ends []events.DeadEnd) []string {
	var out []string
	for _, d := range ends {
		out = append(out, ladder.Normalize(d.Approach))
	}
	return out
}

// A task that starts on PIVOT because its subject keeps failing is shown
// the subject's recent failed approaches as dead ends, and its run carries
// them, so the recorder rejects an answer that repeats one (SPEC §8: PIVOT
// receives the dead-ends log).
func TestRecurringStartOnPivotShowsTheSubjectsDeadEnds(t *testing.T) {
	day := 24 * time.Hour
	var kept []history.Entry
	for i, approach := range []string{"bump the z-index", "add !important", "", "wrap in a flex box"} {
		kept = append(kept, history.Entry{Key: fmt.Sprint(i), TaskID: fmt.Sprint("old", i), Attempt: 1, Rung: events.RungRefine,
			Outcome: events.OutcomeFailure, Approach: approach, Error: "still overlaps", At: now.Add(-time.Duration(4-i) * day)})
	}
	s := newService(t, Config{History: &fakeHistory{entries: kept}})
	b := events.Base{Task: events.Task{ID: "t1", Type: "css_fix", Subject: "src/app.css", SubmittedAt: now},
		Run: events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Step: "execute"}}
	_, p := handle(t, s, b)
	if p.Run.Rung != events.RungPivot {
		t.Fatalf("rung %s, want PIVOT", p.Run.Rung)
	}
	want := []string{"bump the z index", "add important", "wrap in a flex box"}
	if got := normalized(p.Run.DeadEnds); !slices.Equal(got, want) {
		t.Errorf("the run carries dead ends %q, want the subject's failed approaches %q", got, want)
	}
	for _, d := range p.Run.DeadEnds {
		if d.Attempt != 0 || d.Reason != "still overlaps" {
			t.Errorf("dead end %+v, want an earlier task's (attempt 0) with its error", d)
		}
	}
	if got := shownApproaches(t, p); !slices.Equal(got, want) {
		t.Errorf("the prompt shows dead ends %q, want %q", got, want)
	}
}

// A budget too small for every dead end shows the newest ones, and the run
// carries exactly those: the dead ends PIVOT enforces are the ones the
// model was shown.
func TestTheRunCarriesTheDeadEndsThePromptShows(t *testing.T) {
	var ends []events.DeadEnd
	for i := range 8 {
		ends = append(ends, events.DeadEnd{Attempt: i + 1, Rung: events.RungRefine,
			Approach: fmt.Sprintf("approach number %d, %s", i+1, strings.Repeat("detail ", 10)),
			Reason:   "it failed in a way worth a long explanation " + strings.Repeat("because ", 12)})
	}
	s := newService(t, Config{History: &fakeHistory{}})
	b := testBase()
	b.Run = events.Run{Pass: 9, Attempt: 9, Rung: events.RungPivot, Step: "execute", DeadEnds: ends}
	_, p := handle(t, s, b)
	shown := shownApproaches(t, p)
	if len(shown) == 0 || len(shown) == len(ends) {
		t.Fatalf("%d of %d dead ends shown: the test wants a budget that shows some", len(shown), len(ends))
	}
	if got := normalized(p.Run.DeadEnds); !slices.Equal(got, shown) {
		t.Fatalf("the run carries %q, the prompt shows %q: they must be the same", got, shown)
	}
	if want := normalized(ends[len(ends)-len(shown):]); !slices.Equal(shown, want) {
		t.Errorf("shown %q, want the newest %q", shown, want)
	}
	for i, d := range p.Run.DeadEnds {
		if orig := ends[len(ends)-len(shown)+i]; d != orig {
			t.Errorf("dead end %d carried as %+v, want it whole %+v (the prompt clips, the judge does not)", i, d, orig)
		}
	}
}

// However large the budget, a prompt shows no more dead ends than a task
// keeps (ladder.MaxDeadEnds, the newest), and a dead end whose text was
// cut shows its cut marked; the run carries the same ones, as kept.
func TestThePromptShowsTheDeadEndsAsKept(t *testing.T) {
	var ends []events.DeadEnd
	for i := range ladder.MaxDeadEnds + 8 {
		ends = append(ends, events.DeadEnd{Attempt: i + 1, Rung: events.RungPivot, Approach: fmt.Sprint("approach ", i+1), Reason: "broken"})
	}
	ends[len(ends)-1].Approach = strings.Repeat("regenerate the stylesheet ", 200)
	b := testBase()
	b.Run = events.Run{Pass: 41, Attempt: 41, Rung: events.RungPivot, Step: "execute", DeadEnds: ends}
	data, enforced := fit(b, nil, 1_000_000, false)
	if n := strings.Count(data.DeadEnds, "<dead_end "); n != ladder.MaxDeadEnds || len(enforced) != n {
		t.Fatalf("%d dead ends shown, %d carried; want the %d a task keeps", n, len(enforced), ladder.MaxDeadEnds)
	}
	if enforced[0].Attempt != 9 {
		t.Errorf("the oldest shown is of attempt %d, want 9: the newest are kept", enforced[0].Attempt)
	}
	last := enforced[len(enforced)-1]
	if len(last.Approach) > events.MaxApproach || !strings.HasSuffix(last.Approach, " bytes more]") {
		t.Errorf("the long approach is carried with %d bytes, its cut unmarked", len(last.Approach))
	}
	if !strings.Contains(data.DeadEnds, "bytes more]") {
		t.Errorf("the prompt does not show the cut:\n%s", data.DeadEnds)
	}
}
