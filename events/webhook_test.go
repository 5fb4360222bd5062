package events

import (
	"errors"
	"testing"
	"time"
)

func TestWebhookSignature(t *testing.T) {
	secret, body := []byte("whsec_test"), []byte(`{"id":"t1","status":"succeeded"}`)
	at := time.Unix(1_700_000_000, 0)
	const id = "whd_0123456789abcdef01234567"
	h := SignWebhook(secret, at, id, body)
	// Computed independently: printf '1700000000.whd_0123456789abcdef01234567.{"id":"t1","status":"succeeded"}' | openssl dgst -sha256 -hmac whsec_test
	if want := "t=1700000000,v1=0dfa9c690760ee0e66c033a04f02f1e38e2da1d6673a8bbefdc6dd02cb8fdd64"; h != want {
		t.Fatalf("header %q, want %q", h, want)
	}
	for _, c := range []struct {
		name   string
		header string
		id     string
		body   []byte
		secret []byte
		now    time.Time
		want   error
	}{
		{"valid", h, id, body, secret, at.Add(time.Minute), nil},
		{"rotated secret listed second", "t=1700000000,v1=00ff," + h[len("t=1700000000,"):], id, body, secret, at, nil},
		{"other body", h, id, []byte(`{"id":"t2"}`), secret, at, ErrWebhookSignature},
		{"other secret", h, id, body, []byte("other"), at, ErrWebhookSignature},
		{"too old", h, id, body, secret, at.Add(6 * time.Minute), ErrWebhookTimestamp},
		{"from the future", h, id, body, secret, at.Add(-6 * time.Minute), ErrWebhookTimestamp},
		{"no v1", "t=1700000000", id, body, secret, at, ErrWebhookHeader},
		{"no t", "v1=abc", id, body, secret, at, ErrWebhookHeader},
		{"garbage", "sha256=abc", id, body, secret, at, ErrWebhookHeader},
		{"empty", "", id, body, secret, at, ErrWebhookHeader},
		{"another delivery id", h, "whd_another", body, secret, at, ErrWebhookSignature},
	} {
		if err := VerifyWebhook(c.secret, c.header, c.id, c.body, c.now, 0); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

func TestWebhookDeliveryID(t *testing.T) {
	st := TaskState{ID: "t1", SubmitSeq: 4, Pass: 2, Status: StatusSucceeded}
	id := WebhookDeliveryID(st)
	if id != WebhookDeliveryID(st) || len(id) != len("whd_")+24 {
		t.Fatalf("id %q not deterministic or of the wrong length", id)
	}
	for name, edit := range map[string]func(*TaskState){
		"status":  func(s *TaskState) { s.Status = StatusFailed },
		"pass":    func(s *TaskState) { s.Pass = 3 },
		"actions": func(s *TaskState) { s.Actions = []Action{{}} },
		"task":    func(s *TaskState) { s.ID = "t2" },
	} {
		other := st
		edit(&other)
		if WebhookDeliveryID(other) == id {
			t.Errorf("%s changed, the id did not", name)
		}
	}
	other := st
	other.Attempts, other.Cost = 9, 1.5
	if WebhookDeliveryID(other) != id {
		t.Error("the id changed with fields that do not make a settlement")
	}
}

func TestParseWebhookSubject(t *testing.T) {
	for subject, want := range map[string][2]string{
		WebhookDueSubject("t-1"): {"due", "t-1"}, WebhookTrySubject("t-1"): {"try", "t-1"},
		WebhookDeliveredSubject("x_2"): {"delivered", "x_2"},
		"dispatch.webhook.due":         {}, "dispatch.webhook.due.a.b": {}, "dispatch.task.t-1.queued": {}, "dispatch.webhook..t": {},
	} {
		kind, id, ok := ParseWebhookSubject(subject)
		if ok != (want[0] != "") || kind != want[0] || id != want[1] {
			t.Errorf("%q: %q %q %v, want %q", subject, kind, id, ok, want)
		}
	}
}

func FuzzVerifyWebhook(f *testing.F) {
	f.Add("t=1700000000,v1=abc", []byte("{}"))
	f.Add(",,==,", []byte(""))
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		now := time.Unix(1_700_000_000, 0)
		err := VerifyWebhook([]byte("k"), header, "d", body, now, 0)
		if err == nil && header != SignWebhook([]byte("k"), now, "d", body) {
			// Only a header carrying a valid MAC of body may pass.
			if VerifyWebhook([]byte("other"), header, "d", body, now, 0) == nil {
				t.Fatalf("header %q verified under two secrets", header)
			}
		}
	})
}
