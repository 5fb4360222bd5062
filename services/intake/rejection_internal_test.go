package intake

import (
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// rejection finds the problems again from the kept bytes, reading the type
// token of the subject they arrived on; the kept error stands in otherwise.
func TestRejection(t *testing.T) {
	for _, c := range []struct {
		name, origSubject, data, keptError string
		problems                           []string
	}{
		{"typed subject supplies the type", "dispatch.submit.css_fix", `{"id":"x"}`, "invalid task: …",
			[]string{`"subject" is required`}},
		{"through the API the type is required", events.SubmitAPI, `{"id":"x"}`, "invalid task: …",
			[]string{`"type" is required`, `"subject" is required`}},
		{"a bare dispatch.submit has no type token", "dispatch.submit", `{"id":"x","subject":"s"}`, "invalid task: …",
			[]string{`"type" is required`}},
		{"decodes now: the kept error says why", "dispatch.submit.css_fix", `{"id":"x","subject":"s"}`, "too deep",
			[]string{"too deep"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := nats.Header{}
			h.Set(events.HeaderOrigSubj, c.origSubject)
			h.Set(events.HeaderError, c.keptError)
			ae := rejection("x", h, []byte(c.data))
			if ae.Code != events.CodeRejected || !slices.Equal(ae.Problems, c.problems) {
				t.Fatalf("got %+v, want problems %q", ae, c.problems)
			}
			if !strings.Contains(ae.Message, "task x was rejected") || !strings.Contains(ae.Message, c.keptError) {
				t.Fatalf("message %q", ae.Message)
			}
		})
	}
}
