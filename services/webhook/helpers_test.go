package webhook_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/webhook"
)

// givenUp is the deliveries ListFailing lists as given up.
func givenUp(t *testing.T, js jetstream.JetStream) ([]webhook.Failing, error) {
	all, err := webhook.ListFailing(t.Context(), js)
	var out []webhook.Failing
	for _, f := range all {
		if f.State == webhook.StateGivenUp {
			out = append(out, f)
		}
	}
	return out, err
}

func streamLast(t *testing.T, js jetstream.JetStream, subject string) (*jetstream.RawStreamMsg, error) {
	s, err := js.Stream(t.Context(), services.Stream)
	if err != nil {
		return nil, err
	}
	return s.GetLastMsgForSubject(t.Context(), subject)
}
