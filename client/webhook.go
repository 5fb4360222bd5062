package client

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// The headers of a webhook delivery (docs/api.md#webhooks).
const (
	SignatureHeader = events.WebhookSignatureHeader // t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<delivery id>.<body>">
	DeliveryHeader  = events.WebhookDeliveryHeader  // the delivery id (signed): deduplicate on it
)

// MaxWebhookBody bounds the body ReadWebhook reads.
const MaxWebhookBody = 4 << 20

// VerifyWebhook checks a delivery's Dispatch-Signature value against its
// Dispatch-Delivery id and raw body under the shared secret, and that it
// was signed within tolerance of now (0: 5 minutes). See
// events.VerifyWebhook.
func VerifyWebhook(secret []byte, signature, delivery string, body []byte, now time.Time, tolerance time.Duration) error {
	return events.VerifyWebhook(secret, signature, delivery, body, now, tolerance)
}

// ReadWebhook reads and verifies a webhook POST: the task's outcome (the
// answer Wait gives) and the delivery id to deduplicate on. A signature
// that does not verify is an error wrapping events.ErrWebhookSignature,
// ErrWebhookTimestamp or ErrWebhookHeader: answer it 401. The mesh
// delivers at least once: handle a delivery id once, and answer 2xx to a
// repeat.
func ReadWebhook(r *http.Request, secret []byte) (Outcome, string, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxWebhookBody))
	if err != nil {
		return Outcome{}, "", fmt.Errorf("webhook body: %w", err)
	}
	if err := VerifyWebhook(secret, r.Header.Get(SignatureHeader), r.Header.Get(DeliveryHeader), body, time.Now(), 0); err != nil {
		return Outcome{}, "", err
	}
	var o Outcome
	if err := json.Unmarshal(body, &o); err != nil {
		return Outcome{}, "", fmt.Errorf("webhook body: %w", err)
	}
	return o, r.Header.Get(DeliveryHeader), nil
}
