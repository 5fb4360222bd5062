package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// maxDeliveriesAdvisory is the part of the server's
// io.nats.jetstream.advisory.v1.max_deliver advisory the reaper needs.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries int    `json:"deliveries"`
}

// ReaperSpec is the service that catches messages whose worker died on their
// last delivery (so the router never dead-lettered them): for each
// max-delivery advisory it copies the original message to
// dispatch.review.poison. The copy's Msg-Id is the one the router would have
// used, so a message is never recorded twice.
func ReaperSpec(js jetstream.JetStream) Spec {
	return Spec{
		Name:    ConsumerReaper,
		Stream:  AdvisoryStream,
		Filters: AdvisorySubjects,
		Handler: func(ctx context.Context, m *Msg) ([]Out, error) {
			var adv maxDeliveriesAdvisory
			if err := json.Unmarshal(m.Data, &adv); err != nil || adv.Stream == "" || adv.StreamSeq == 0 {
				return nil, Dead(events.ReviewPoison, fmt.Errorf("undecodable advisory: %s", m.Data))
			}
			stream, err := js.Stream(ctx, adv.Stream)
			if err != nil {
				return nil, err
			}
			raw, err := stream.GetMsg(ctx, adv.StreamSeq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return nil, nil // aged out of the stream: nothing left to keep
			}
			if err != nil {
				return nil, err
			}
			orig := &Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data, Seq: raw.Sequence, Time: raw.Time}
			cause := fmt.Errorf("consumer %s gave up after %d deliveries without the message being settled", adv.Consumer, adv.Deliveries)
			return []Out{DeadLetter(orig, adv.Stream, events.ReviewPoison, "", cause)}, nil
		},
	}
}
