package webhook_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/services"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func streamLast(t *testing.T, js jetstream.JetStream, subject string) (*jetstream.RawStreamMsg, error) {
	s, err := js.Stream(t.Context(), services.Stream)
	if err != nil {
		return nil, err
	}
	return s.GetLastMsgForSubject(t.Context(), subject)
}
