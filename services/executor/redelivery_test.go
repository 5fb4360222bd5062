package executor_test

import (
	"net/http"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/internal/natstest"
	"dispatchmesh/internal/policy"
	"dispatchmesh/services"
	"dispatchmesh/services/executor"
)

// A redelivery whose first delivery's Executed is stored — its ack was lost,
// or the process died between the publish and the ack — has nothing left to
// do: the model is not called again (it would pay twice, and the second
// answer would be dropped as a duplicate with its spend).
func TestRedeliveryAfterTheExecutedIsStoredCallsNothing(t *testing.T) {
	ns := natstest.Start(t)
	stores, err := services.Provision(t.Context(), ns.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, always(ok("x")), policy.Type{}, func(c *executor.Config) {
		c.Tasks, c.NATS = services.NewTaskStore(stores.Tasks), ns.NC
	})
	first := e.handle("t1", 1, testMessages)
	if first.err != nil || len(first.outs) != 1 {
		t.Fatalf("first delivery: %d outputs, %v", len(first.outs), first.err)
	}
	o := first.outs[0]
	if _, err := ns.JS.PublishMsg(t.Context(), services.NatsMsg(o), jetstream.WithMsgID(o.MsgID)); err != nil {
		t.Fatal(err)
	}
	again := e.redeliver("t1", 1, testMessages)
	if again.err != nil || len(again.outs) != 0 {
		t.Fatalf("redelivery: %d outputs, %v; want nothing to publish", len(again.outs), again.err)
	}
	if n := e.model.Calls(); n != 1 {
		t.Fatalf("model called %d times for one pass, want 1", n)
	}
	// A snoozed pass (no Executed yet) is redelivered too: it does call.
	if r := e.redeliver("t1", 2, testMessages).result(t); r.Outcome != events.OutcomeSuccess {
		t.Fatalf("a redelivered pass without an Executed: %+v", r)
	}
	if n := e.model.Calls(); n != 2 {
		t.Fatalf("model called %d times, want 2", n)
	}
}

// A deterministic failure whose Executed was never stored (the publish
// failed, or the process died before it) is redelivered: the identical
// request is not sent again, it is refused.
func TestRedeliveryAfterADeterministicFailureDoesNotResend(t *testing.T) {
	e := newEnv(t, always(status(http.StatusBadRequest, badRequest)), policy.Type{}, nil)
	if r := e.handle("t1", 1, testMessages).result(t); r.ErrorClass != events.ErrorClassDeterministic {
		t.Fatalf("first delivery: %+v, want a deterministic failure", r)
	}
	r := e.redeliver("t1", 1, testMessages).result(t)
	if !r.Refused || r.ErrorClass != events.ErrorClassRefused {
		t.Fatalf("redelivery: %+v, want the identical request refused", r)
	}
	if n := e.model.Calls(); n != 1 {
		t.Fatalf("model received %d calls, want 1: the request that failed deterministically was sent again", n)
	}
}

// What an attempt's cut-short tries spent stays unbilled until the Result
// that bills it is recorded: a redelivery whose first Executed was never
// stored bills it again instead of losing it.
func TestUnbilledSpendSurvivesALostExecuted(t *testing.T) {
	e := newEnv(t, always(ok("x")), policy.Type{}, nil)
	earlier := events.Usage{TokensIn: 120, TokensOut: 30, Cost: 0.0015}
	if _, err := e.tasks.Update(t.Context(), "t1", func(st *events.TaskState, _ bool) error {
		st.ID, st.Type, st.Status, st.Pass, st.Unbilled = "t1", "css_fix", events.StatusRunning, 1, earlier
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	first := e.handle("t1", 1, testMessages).result(t) // its Executed is lost
	again := e.redeliver("t1", 1, testMessages).result(t)
	call := first.TokensIn - earlier.TokensIn
	if call <= 0 || again.TokensIn != earlier.TokensIn+call || again.TokensOut != first.TokensOut {
		t.Fatalf("first Executed bills %d/%d tokens, the redelivered one %d/%d; want the earlier tries' %d/%d in both",
			first.TokensIn, first.TokensOut, again.TokensIn, again.TokensOut, earlier.TokensIn, earlier.TokensOut)
	}
}
