package events

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Webhook subjects and names: the webhook service files a delivery due when
// a task with a callback URL settles, delivers it, and records the outcome.
const (
	WebhookRoot = Root + ".webhook" // dispatch.webhook.<kind>.<task id>
	// WebhookFilter matches every webhook event (kept on Stream).
	WebhookFilter = WebhookRoot + ".>"
	// ReviewWebhook is the review reason of a delivery given up after its
	// last try: dispatch.review.webhook.<task id>.
	ReviewWebhook = "webhook"

	EventWebhookDue       = "webhook.due.v1"
	EventWebhookTry       = "webhook.try.v1"
	EventWebhookDelivered = "webhook.delivered.v1"
	EventWebhookFailed    = "review.webhook.v1"
)

// The headers of a webhook POST (docs/api.md#webhooks).
const (
	// WebhookSignatureHeader is "t=<unix seconds>,v1=<hex HMAC-SHA256 of
	// "<t>.<delivery id>.<body>" under the shared secret>", in Stripe's format.
	WebhookSignatureHeader = "Dispatch-Signature"
	// WebhookDeliveryHeader is the delivery id: the same on every try of one
	// settlement of one task; a receiver deduplicates on it.
	WebhookDeliveryHeader = "Dispatch-Delivery"
	// WebhookTaskHeader is the task id; WebhookAttemptHeader the try (1, 2, …).
	WebhookTaskHeader    = "Dispatch-Task-Id"
	WebhookAttemptHeader = "Dispatch-Attempt"
)

// DefaultWebhookTolerance is how old a signature's timestamp a receiver
// accepts by default (VerifyWebhook), as Stripe's libraries do.
const DefaultWebhookTolerance = 5 * time.Minute

// WebhookDueSubject is where a delivery for the task falls due.
func WebhookDueSubject(taskID string) string { return WebhookRoot + ".due." + taskID }

// WebhookTaskFilter matches every webhook event of one task.
func WebhookTaskFilter(taskID string) string { return WebhookRoot + ".*." + taskID }

// ParseWebhookSubject reads dispatch.webhook.<kind>.<task id>.
func ParseWebhookSubject(subject string) (kind, taskID string, ok bool) {
	rest, ok := strings.CutPrefix(subject, WebhookRoot+".")
	if !ok {
		return "", "", false
	}
	kind, taskID, ok = strings.Cut(rest, ".")
	if !ok || kind == "" || !ValidID(taskID) {
		return "", "", false
	}
	return kind, taskID, true
}

// WebhookTrySubject records a failed try that will be tried again.
func WebhookTrySubject(taskID string) string { return WebhookRoot + ".try." + taskID }

// WebhookDeliveredSubject records a delivery the receiver accepted.
func WebhookDeliveredSubject(taskID string) string { return WebhookRoot + ".delivered." + taskID }

// WebhookDue is a delivery to make: the wait answer of a settled task
// (Body, api.wait.reply.v1) to its callback URL, under a delivery id.
type WebhookDue struct {
	DeliveryID string          `json:"delivery_id"`
	TaskID     string          `json:"task_id"`
	URL        string          `json:"url"`
	Status     Status          `json:"status"`
	Body       json.RawMessage `json:"body"`
	SettledAt  time.Time       `json:"settled_at"`
}

// WebhookDelivered records a delivery the receiver answered with 2xx.
type WebhookDelivered struct {
	DeliveryID string    `json:"delivery_id"`
	TaskID     string    `json:"task_id"`
	URL        string    `json:"url"`
	Attempt    int       `json:"attempt"`
	Code       int       `json:"code"`
	At         time.Time `json:"at"`
}

// WebhookTry records a failed try of a delivery that is tried again at
// NextAt: what `dispatch webhooks` lists as retrying.
type WebhookTry struct {
	DeliveryID string `json:"delivery_id"`
	TaskID     string `json:"task_id"`
	URL        string `json:"url"`
	Attempt    int    `json:"attempt"`
	// Code is the receiver's HTTP status, 0 when none answered.
	Code   int       `json:"code,omitempty"`
	Error  string    `json:"error"`
	At     time.Time `json:"at"`
	NextAt time.Time `json:"next_at"`
}

// WebhookFailed is the review record of a delivery given up: after its last
// try, or at once when its URL is not allowed. Due is what to redeliver.
type WebhookFailed struct {
	Due       WebhookDue `json:"due"`
	Attempts  int        `json:"attempts"`
	LastError string     `json:"last_error"`
	At        time.Time  `json:"at"`
}

// WebhookDeliveryID is the delivery id of the settlement st: derived from
// the task, when it was created, its pass, its status and how many human
// actions it has seen, so each try — and a rebuild of the state, which
// restores each of them — carries the same id, and a task that settles
// again (a human's requeue) gets a new one.
func WebhookDeliveryID(st TaskState) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d\x00%s\x00%d", st.ID, st.CreatedAt.UnixNano(), st.Pass, st.Status, len(st.Actions)))
	return "whd_" + hex.EncodeToString(sum[:12])
}

// SignWebhook is the signature header value of delivery's body sent at t
// under secret: the MAC covers the timestamp, the delivery id and the
// body, so a receiver that deduplicates on the delivery id relies on a
// signed value (a replay under another id does not verify).
func SignWebhook(secret []byte, t time.Time, delivery string, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + webhookMAC(secret, ts, delivery, body)
}

// webhookMAC is the hex HMAC-SHA256 of "<ts>.<delivery>.<body>".
func webhookMAC(secret []byte, ts, delivery string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write([]byte(delivery))
	m.Write([]byte{'.'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Errors of VerifyWebhook.
var (
	ErrWebhookHeader    = errors.New("webhook: malformed signature header")
	ErrWebhookSignature = errors.New("webhook: no signature matches")
	ErrWebhookTimestamp = errors.New("webhook: timestamp outside the tolerance")
)

// VerifyWebhook checks header (the Dispatch-Signature value) against the
// delivery id (the Dispatch-Delivery value) and body under secret, and that its timestamp is within tolerance of now (0:
// DefaultWebhookTolerance). Several v1 entries may be present (a secret
// being rotated): one matching is enough. Comparison is constant-time.
func VerifyWebhook(secret []byte, header, delivery string, body []byte, now time.Time, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = DefaultWebhookTolerance
	}
	var ts string
	var sigs []string
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		switch {
		case !ok:
			return ErrWebhookHeader
		case k == "t":
			ts = v
		case k == "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrWebhookHeader
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrWebhookTimestamp
	}
	want := webhookMAC(secret, ts, delivery, body)
	for _, s := range sigs {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return ErrWebhookSignature
}
