package whatif_test

import (
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	core "github.com/dispatchmesh/dispatchmesh/internal/core/whatif"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/whatif"
)

// Whatever a stream message holds, Decode returns an event, nothing, or
// an error — never a panic; a message it reads is an event of a task (or
// a human's action), and a replay of it does not panic either.
func FuzzDecode(f *testing.F) {
	f.Add("dispatch.task.t-1.executed", []byte(`{"task":{"id":"t-1","type":"css_fix"},"run":{"pass":1,"attempt":1},"result":{"outcome":"success","tokens_in":3}}`))
	f.Add("dispatch.task.t-1.held", []byte(`{"task":{"id":"t-1","type":"css_fix"},"hold":"trust","trust":{"cause":"trust"}}`))
	f.Add("dispatch.review.escalated.t-1", []byte(`{"task":{"id":"t-1"},"cause":"rung_rate"}`))
	f.Add("dispatch.review.action.t-1", []byte(`{"task_id":"t-1","action":"requeue"}`))
	f.Add("dispatch.task.t-1.retry", []byte(`{"run":{"pass":-3}}`))
	f.Add("dispatch.review.gated.t-1", []byte(`[1,2`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		ev, ok, err := whatif.Decode(rebuild.Message{Subject: subject, Data: data, Stored: time.Unix(1, 0)})
		if err != nil || !ok {
			return
		}
		if ev.Kind == "" {
			t.Fatalf("%s: an event without a kind", subject)
		}
		// The replay takes whatever decodes without a panic.
		evs, _ := whatif.Events([]rebuild.Message{{Subject: subject, Data: data}})
		core.Replay(evs, core.Options{Policy: &policy.File{}})
	})
}
