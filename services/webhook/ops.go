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

// Failing is a delivery given up and not delivered since: its latest
// review record and that record's stream sequence.
type Failing struct {
	events.WebhookFailed
	Seq uint64 `json:"seq"`
}

// ListFailing returns the deliveries given up (review records on
// dispatch.review.webhook.*) that no later try delivered, oldest first.
func ListFailing(ctx context.Context, js jetstream.JetStream) ([]Failing, error) {
	filters := []string{events.ReviewSubject(events.ReviewWebhook, "*"), events.WebhookDeliveredSubject("*")}
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
	var order []string
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read webhook records: %w", err)
		}
		n := uint64(0)
		for msg := range batch.Messages() {
			n++
			md, _ := msg.Metadata()
			var f events.WebhookFailed
			var d events.WebhookDelivered
			switch {
			case msg.Headers().Get(events.HeaderEvent) == events.EventWebhookFailed && json.Unmarshal(msg.Data(), &f) == nil && md != nil:
				if _, seen := failing[f.Due.DeliveryID]; !seen {
					order = append(order, f.Due.DeliveryID)
				}
				failing[f.Due.DeliveryID] = Failing{WebhookFailed: f, Seq: md.Sequence.Stream}
			case json.Unmarshal(msg.Data(), &d) == nil:
				delete(failing, d.DeliveryID)
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

// Redeliver files f's delivery due again, under the same delivery id: the
// webhook service tries it anew, MaxAttempts times. Its Msg-Id is salted
// with the review record's sequence, so the stream's duplicate window does
// not swallow it, and redelivering the same record twice files it once.
func Redeliver(ctx context.Context, js jetstream.JetStream, f Failing) error {
	out, err := services.Emit(events.WebhookDueSubject(f.Due.TaskID),
		"webhook:"+f.Due.DeliveryID+":redeliver:"+strconv.FormatUint(f.Seq, 10), events.EventWebhookDue, f.Due.TaskID, f.Due)
	if err != nil {
		return err
	}
	_, err = js.PublishMsg(ctx, services.NatsMsg(out), jetstream.WithMsgID(out.MsgID))
	return err
}
