package review

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
)

func FuzzDecodeRecord(f *testing.F) {
	f.Add("dispatch.review.rejected.seq-9", "dispatch.submit.css_fix", []byte(`{"subject": "x",`))
	f.Add("dispatch.review.gated.t-1", "", []byte(`{"task":{"id":"t-1","type":"css_fix","subject":"a"},"run":{"pass":2}}`))
	f.Add("dispatch.review.action.t-1", "", []byte(`{"task_id":"t-1","action":"requeue","note":"n","by":"b","at":"2026-05-18T14:00:00Z"}`))
	f.Add("dispatch.review.poison.t-1", "", []byte("\xff\xfe not json"))
	f.Add("dispatch.review.action.t-1", "", []byte(`{"at":"yesterday"}`))
	f.Add("nonsense", "", []byte(`null`))
	f.Fuzz(func(t *testing.T, subject, orig string, data []byte) {
		h := nats.Header{}
		h.Set(events.HeaderOrigSubj, orig)
		r := decodeRecord(subject, h, data)
		if r.Body != nil && !json.Valid(r.Body) {
			t.Fatalf("body %q kept as JSON", r.Body)
		}
		if r.Body == nil && len(r.Raw) > maxRaw+len("…") {
			t.Fatalf("raw body of %d bytes kept", len(r.Raw))
		}
		if r.Action != nil && r.Reason != ReasonAction {
			t.Fatalf("an action decoded from %s", subject)
		}
		if _, err := json.Marshal(r); err != nil {
			t.Fatalf("record does not encode: %v", err)
		}
	})
}
