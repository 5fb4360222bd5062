package executor_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// Every model call of a tool loop is one observation of its prompt tokens,
// labelled with the attempt's rung; the attempt's TokensIn is their sum.
func TestPromptTokensPerCall(t *testing.T) {
	ns := natstest.Start(t)
	startUserTool(t, ns.NC)
	answer := ok("created the user")
	answer.TokensIn = 3000
	e := newEnv(t, sequence(
		toolCalls(1, [2]string{"create_user", `{"name":"Ann","email":"ann@example.com"}`}), // 100 prompt tokens
		answer,
		ok("a pipeline step"),
	), policy.Type{Tools: []policy.Tool{createUser}}, func(c *executor.Config) { c.NATS = ns.NC })

	r := e.handleRun("t1", events.Run{Pass: 1, Attempt: 1, Rung: events.RungPivot, Step: "execute"}, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.TokensIn != 3100 {
		t.Fatalf("result %+v, want a success of 3100 prompt tokens", r)
	}
	n, sum := promptHistogram(t, e.reg, map[string]string{"type": "css_fix", "rung": string(events.RungPivot)})
	if n != 2 || sum != 3100 {
		t.Errorf("dispatch_prompt_tokens{css_fix,PIVOT}: %d calls, %v tokens; want 2 calls, 3100", n, sum)
	}
	e.handleRun("t2", events.Run{Pass: 1, Attempt: 1, Step: "implement"}, testMessages).result(t)
	if n, _ := promptHistogram(t, e.reg, map[string]string{"type": "css_fix", "rung": "none"}); n != 1 {
		t.Errorf("a call on no rung: %d observations labelled none, want 1", n)
	}
}

// promptHistogram is the sample count and sum of dispatch_prompt_tokens
// series whose labels include want.
func promptHistogram(t *testing.T, reg prometheus.Gatherer, want map[string]string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "dispatch_prompt_tokens" {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			n += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return n, sum
}
