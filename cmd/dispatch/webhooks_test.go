package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services/webhook"
)

func TestPickFailing(t *testing.T) {
	f := func(task, id string) webhook.Failing {
		return webhook.Failing{State: webhook.StateGivenUp, WebhookFailed: events.WebhookFailed{Due: events.WebhookDue{TaskID: task, DeliveryID: id}}}
	}
	retrying := f("t3", "whd_d")
	retrying.State = webhook.StateRetrying
	failing := []webhook.Failing{f("t1", "whd_a"), f("t2", "whd_b"), f("t1", "whd_c"), retrying}
	ids := func(fs []webhook.Failing) []string {
		var out []string
		for _, x := range fs {
			out = append(out, x.Due.DeliveryID)
		}
		return out
	}
	for _, c := range []struct {
		ids          []string
		all          bool
		want, absent []string
	}{
		{[]string{"t1"}, false, []string{"whd_a", "whd_c"}, nil},
		{[]string{"whd_b", "t9"}, false, []string{"whd_b"}, []string{"t9"}},
		{nil, true, []string{"whd_a", "whd_b", "whd_c"}, nil},
		{[]string{"t3"}, false, nil, []string{"t3"}}, // still being tried
	} {
		picked, missing := pickFailing(failing, c.ids, c.all)
		if !slices.Equal(ids(picked), c.want) || !slices.Equal(missing, c.absent) {
			t.Errorf("%v all=%v: picked %v missing %v, want %v and %v", c.ids, c.all, ids(picked), missing, c.want, c.absent)
		}
	}
}

func TestWriteFailing(t *testing.T) {
	var b bytes.Buffer
	if err := writeFailing(&b, nil); err != nil || !strings.Contains(b.String(), "no webhook delivery is failing") {
		t.Fatalf("empty: %q %v", b.String(), err)
	}
	b.Reset()
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	err := writeFailing(&b, []webhook.Failing{{State: webhook.StateGivenUp, WebhookFailed: events.WebhookFailed{
		Due:      events.WebhookDue{TaskID: "t1", DeliveryID: "whd_a", URL: "https://h.example/x", Status: events.StatusSucceeded},
		Attempts: 12, LastError: "the receiver answered 503", At: at}},
		{State: webhook.StateRetrying, WebhookFailed: events.WebhookFailed{Due: events.WebhookDue{TaskID: "t2", DeliveryID: "whd_b"}, Attempts: 2, At: at},
			NextAt: at.Add(20 * time.Second)}})
	for _, want := range []string{"DELIVERY", "whd_a", "t1", "given_up", "12", "2026-11-27 12:00:00", "https://h.example/x", "the receiver answered 503",
		"whd_b", "retrying", "2026-11-27 12:00:20"} {
		if err != nil || !strings.Contains(b.String(), want) {
			t.Errorf("%q lacks %q (%v)", b.String(), want, err)
		}
	}
}
