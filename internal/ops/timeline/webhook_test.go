package timeline_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// A task's timeline holds its webhook deliveries: filed, tried, delivered.
func TestWebhookEventsInTheTimeline(t *testing.T) {
	srv := natstest.Start(t)
	if _, err := services.Provision(t.Context(), srv.JS, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	due := events.WebhookDue{DeliveryID: "whd_1", TaskID: "t1", URL: "https://h.example/x", Status: events.StatusSucceeded, Body: []byte(`{}`), SettledAt: at}
	for _, e := range []struct {
		subject, name string
		v             any
	}{
		{events.TaskSubject("t1", events.StageSucceeded), events.EventSucceeded, events.Succeeded{}},
		{events.WebhookDueSubject("t1"), events.EventWebhookDue, due},
		{events.WebhookTrySubject("t1"), events.EventWebhookTry, events.WebhookTry{DeliveryID: "whd_1", TaskID: "t1", URL: due.URL, Attempt: 1, Code: 503,
			Error: "the receiver answered 503", At: at, NextAt: at.Add(5 * time.Second)}},
		{events.WebhookDeliveredSubject("t1"), events.EventWebhookDelivered, events.WebhookDelivered{DeliveryID: "whd_1", TaskID: "t1", URL: due.URL, Attempt: 2, Code: 204, At: at}},
		{events.WebhookDueSubject("t2"), events.EventWebhookDue, due}, // another task's
	} {
		out, err := services.Emit(e.subject, "", e.name, "t1", e.v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.JS.PublishMsg(t.Context(), services.NatsMsg(out), jetstream.WithMsgID(e.subject)); err != nil {
			t.Fatal(err)
		}
	}
	var stages, summaries []string
	err := timeline.Follow(t.Context(), srv.JS, "t1", false, func(e timeline.Entry) bool {
		stages, summaries = append(stages, e.Stage), append(summaries, e.Summary())
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{events.StageSucceeded, "webhook.due", "webhook.try", "webhook.delivered"}
	if strings.Join(stages, " ") != strings.Join(want, " ") {
		t.Fatalf("stages %q, want %q", stages, want)
	}
	for i, w := range []string{
		`delivery=whd_1 url="https://h.example/x"`,
		`delivery=whd_1 attempt=1 code=503 url="https://h.example/x" error="the receiver answered 503" next=2026-11-27T12:00:05Z`,
		`delivery=whd_1 attempt=2 code=204 url="https://h.example/x"`,
	} {
		if summaries[i+1] != w {
			t.Errorf("%s: %q, want %q", stages[i+1], summaries[i+1], w)
		}
	}
}
