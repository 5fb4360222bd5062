package prompt

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// TestHandleWithHistoryStore runs the builder on a real outcome history, the
// history bucket as the mesh provisions it: the second attempt's prompt
// carries both earlier outcomes of the same (type, subject), escaped, and
// nothing of another subject.
func TestHandleWithHistoryStore(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	stores, err := services.Provision(ctx, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	store := history.NewStore(stores.History)
	for _, e := range []struct {
		subject string
		entry   history.Entry
	}{
		{"src/app.css", history.Entry{Key: "t0:1", TaskID: "t0", Attempt: 1, Rung: RungRefine, Step: "execute",
			Outcome: events.OutcomeFailure, Approach: "set overflow: hidden", Summary: "clipped the text", At: t0}},
		{"src/app.css", history.Entry{Key: "t1:1", TaskID: "t1", Attempt: 1, Rung: RungRefine, Step: "execute",
			Outcome: events.OutcomeFailure, Approach: "word-break", Summary: hostile, Error: "visual diff failed", At: t0.Add(time.Hour)}},
		{"src/other.css", history.Entry{Key: "t9:1", TaskID: "t9", Attempt: 1, Outcome: events.OutcomeSuccess,
			Approach: "unrelated subject", At: t0}},
	} {
		if err := store.Append(ctx, "css_fix", e.subject, e.entry); err != nil {
			t.Fatalf("append: %v", err)
		}
	}

	s := newService(t, Config{History: store})
	b := testBase()
	b.Run = events.Run{Pass: 2, Attempt: 2, Rung: RungRefine, Step: "execute", Context: "visual diff failed"}
	_, p := handle(t, s, b)

	user := p.Prompt.Messages[1].Content
	es := parseUser(t, user)
	attempts := find(es, "attempt")
	if len(find(es, "previous_attempts")) != 1 || len(attempts) != 2 {
		t.Fatalf("want one previous_attempts block with 2 attempts:\n%s", user)
	}
	if !strings.Contains(attempts[0].Text, "set overflow: hidden") || !strings.Contains(attempts[1].Text, hostile) {
		t.Errorf("attempt bodies = %q, %q", attempts[0].Text, attempts[1].Text)
	}
	// t1's error is the last error the prompt already carries: said once.
	if strings.Count(user, "visual diff failed") != 1 {
		t.Errorf("the last error is repeated:\n%s", user)
	}
	if strings.Contains(user, "unrelated subject") || strings.Contains(user, "<system>") {
		t.Errorf("prompt holds another subject's outcome or unescaped markup:\n%s", user)
	}
}
