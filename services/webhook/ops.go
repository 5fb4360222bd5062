package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// States of a failing delivery.
const (
	StateRetrying = "retrying" // a try failed; the next one is due at NextAt
	StateGivenUp  = "given_up" // its tries ran out (a review record): redeliver it
)

// Failing is a delivery not delivered since it last failed: retrying (its
// latest failed try) or given up (its review record, with the delivery to
// redo, and that record's stream sequence).
type Failing struct {
	State string `json:"state"`
	events.WebhookFailed
	// NextAt is when a retrying delivery is tried again.
	NextAt time.Time `json:"next_at,omitzero"`
	Seq    uint64    `json:"seq"`
}

// ListFailing returns the deliveries whose latest record is a failed try
// (dispatch.webhook.try.*) or a review record (dispatch.review.webhook.*)
// — none delivered since (dispatch.webhook.delivered.*) — oldest first.
func ListFailing(ctx context.Context, js jetstream.JetStream) ([]Failing, error) {
	filters := []string{events.WebhookTrySubject("*"), events.ReviewSubject(events.ReviewWebhook, "*"), events.WebhookDeliveredSubject("*")}
	cons, err := js.OrderedConsumer(ctx, services.Stream, jetstream.OrderedConsumerConfig{
		InactiveThreshold: 10 * time.Second, FilterSubjects: filters, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("read webhook records: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read webhook records: %w", err)
	}
	failing := map[string]Failing{}
	// A delivery the receiver accepted stays delivered: a try record stored
	// after it (a try that overlapped the accepted one, its record stored
	// last) does not make it failing again.
	delivered := map[string]bool{}
	var order []string
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read webhook records: %w", err)
		}
		n := uint64(0)
		for msg := range batch.Messages() {
			n++
			f, id, ok := failingOf(msg)
			switch {
			case !ok: // undecodable: not ours to list
			case f == nil:
				delete(failing, id)
				delivered[id] = true
			case delivered[id]:
			default:
				if _, seen := failing[id]; !seen {
					order = append(order, id)
				}
				failing[id] = *f
			}
		}
		if n == 0 {
			if err := batch.Error(); err != nil {
				return nil, fmt.Errorf("read webhook records: %w", err)
			}
			return nil, fmt.Errorf("read webhook records: %d announced, none delivered", pending)
		}
		pending -= min(n, pending)
	}
	var out []Failing
	for _, id := range order {
		if f, ok := failing[id]; ok {
			out = append(out, f)
		}
	}
	return out, nil
}

// failingOf reads one webhook record: the failing delivery it says (nil
// for a delivery) and its delivery id; ok is false for what cannot be read.
func failingOf(msg jetstream.Msg) (f *Failing, id string, ok bool) {
	md, err := msg.Metadata()
	if err != nil {
		return nil, "", false
	}
	switch msg.Headers().Get(events.HeaderEvent) {
	case events.EventWebhookFailed:
		var r events.WebhookFailed
		if json.Unmarshal(msg.Data(), &r) != nil || r.Due.DeliveryID == "" {
			return nil, "", false
		}
		return &Failing{State: StateGivenUp, WebhookFailed: r, Seq: md.Sequence.Stream}, r.Due.DeliveryID, true
	case events.EventWebhookTry:
		var r events.WebhookTry
		if json.Unmarshal(msg.Data(), &r) != nil || r.DeliveryID == "" {
			return nil, "", false
		}
		return &Failing{State: StateRetrying, WebhookFailed: events.WebhookFailed{
			Due:      events.WebhookDue{DeliveryID: r.DeliveryID, TaskID: r.TaskID, URL: r.URL},
			Attempts: r.Attempt, LastError: r.Error, At: r.At,
		}, NextAt: r.NextAt, Seq: md.Sequence.Stream}, r.DeliveryID, true
	case events.EventWebhookDelivered:
		var r events.WebhookDelivered
		if json.Unmarshal(msg.Data(), &r) != nil || r.DeliveryID == "" {
			return nil, "", false
		}
		return nil, r.DeliveryID, true
	}
	return nil, "", false
}

// Redeliver files f's delivery due again, under the same delivery id: the
// webhook service tries it anew, MaxAttempts times. Only a delivery given
// up can be: a retrying one is still being tried. Its Msg-Id is salted
// with the review record's sequence, so the stream's duplicate window does
// not swallow it, and redelivering the same record twice files it once.
func Redeliver(ctx context.Context, js jetstream.JetStream, f Failing) error {
	if f.State != StateGivenUp {
		return fmt.Errorf("delivery %s is %s, not given up: it is still being tried", f.Due.DeliveryID, f.State)
	}
	out, err := services.Emit(events.WebhookDueSubject(f.Due.TaskID),
		"webhook:"+f.Due.DeliveryID+":redeliver:"+strconv.FormatUint(f.Seq, 10), events.EventWebhookDue, f.Due.TaskID, f.Due)
	if err != nil {
		return err
	}
	_, err = js.PublishMsg(ctx, services.NatsMsg(out), jetstream.WithMsgID(out.MsgID))
	return err
}
