package review_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
)

// TestAnsweredRejectionsLeftOutOfTheQueue: a bad task sent to the submit
// API is answered 400 to its caller and kept; the default queue leaves it
// out, Filter.Answered lists it. The same bytes published fire and forget
// reached nobody: they stay in the queue.
func TestAnsweredRejectionsLeftOutOfTheQueue(t *testing.T) {
	m := reviewtest.Start(t, reviewtest.FailUnless("never"), reviewtest.Options{})
	reply, err := m.Srv.NC.Request(events.SubmitAPI, []byte(`{"id":"api-bad","type":"css_fix"}`), reviewtest.Patience)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(reply.Data), `"code":400`) {
		t.Fatalf("submit API answered %s, want a 400", reply.Data)
	}
	m.SubmitRaw("css_fix", []byte(`{"id":"pub-bad","type":"css_fix"}`))
	// A webhook delivery given up has its own queue (dispatch webhooks):
	// neither listed nor counted here.
	hook := nats.NewMsg(events.ReviewSubject(events.ReviewWebhook, "hooked"))
	hook.Header.Set(events.HeaderEvent, events.EventWebhookFailed)
	hook.Data = []byte(`{"due":{"delivery_id":"whd_x","task_id":"hooked","url":"https://h.example/","status":"succeeded","body":{},"settled_at":"2026-01-01T00:00:00Z"},"attempts":12,"last_error":"503","at":"2026-01-01T00:00:00Z"}`)
	if _, err := m.Srv.JS.PublishMsg(bg, hook); err != nil {
		t.Fatal(err)
	}
	q := waitItems(t, m, review.Filter{Answered: true}, 2)
	keys := []string{q.Items[0].Key, q.Items[1].Key}
	if !strings.Contains(strings.Join(keys, " "), "api-bad") {
		t.Fatalf("Answered lists %v, want api-bad among them", keys)
	}
	deadline := time.Now().Add(reviewtest.Patience)
	for {
		q, err := m.Review.List(bg, review.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		open, err := m.Review.OpenCounts(bg)
		if err != nil {
			t.Fatal(err)
		}
		if len(q.Items) == 1 && q.Items[0].Key == "pub-bad" && open[events.ReviewRejected] == 1 && open[events.ReviewWebhook] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("default queue: %+v, open counts %v; want only pub-bad", q.Items, open)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
