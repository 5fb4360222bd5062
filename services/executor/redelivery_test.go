package executor_test

import (
	"net/http"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
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
// request is not sent again, and the attempt fails as it did — an auth
// failure still goes straight to a human — not as a refusal.
func TestRedeliveryAfterADeterministicFailureDoesNotResend(t *testing.T) {
	for name, c := range map[string]struct {
		reply openaitest.Reply
		class events.ErrorClass
	}{
		"bad request": {status(http.StatusBadRequest, badRequest), events.ErrorClassDeterministic},
		"bad key": {status(http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided: sk-test.","type":"invalid_request_error","code":"invalid_api_key"}}`),
			events.ErrorClassAuth},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, always(c.reply), policy.Type{}, nil)
			if r := e.handle("t1", 1, testMessages).result(t); r.ErrorClass != c.class {
				t.Fatalf("first delivery: %+v, want a %s failure", r, c.class)
			}
			r := e.redeliver("t1", 1, testMessages).result(t)
			if r.Refused || r.ErrorClass != c.class || r.Outcome != events.OutcomeFailure {
				t.Fatalf("redelivery: %+v, want the %s failure again", r, c.class)
			}
			if n := e.model.Calls(); n != 1 {
				t.Fatalf("model received %d calls, want 1: the request that failed deterministically was sent again", n)
			}
			if st := e.state("t1"); st.Refused != 0 {
				t.Fatalf("%d refusals counted, want none: nothing tried to repeat the request", st.Refused)
			}
		})
	}
}

// What an attempt's cut-short tries spent stays unbilled until the Result
// that bills it is recorded: a redelivery whose first Executed was never
// stored bills it again instead of losing it.
func TestUnbilledSpendSurvivesALostExecuted(t *testing.T) {
	e := newEnv(t, always(ok("x")), policy.Type{}, nil)
	earlier := events.Usage{TokensIn: 120, TokensOut: 30, Cost: 0.0015}
	e.edit("t1", func(st *events.TaskState) {
		st.ID, st.Type, st.Status, st.Pass, st.Unbilled = "t1", "css_fix", events.StatusRunning, 1, earlier
	})
	first := e.handle("t1", 1, testMessages).result(t) // its Executed is lost
	again := e.redeliver("t1", 1, testMessages).result(t)
	call := first.TokensIn - earlier.TokensIn
	if call <= 0 || again.TokensIn != earlier.TokensIn+call || again.TokensOut != first.TokensOut {
		t.Fatalf("first Executed bills %d/%d tokens, the redelivered one %d/%d; want the earlier tries' %d/%d in both",
			first.TokensIn, first.TokensOut, again.TokensIn, again.TokensOut, earlier.TokensIn, earlier.TokensOut)
	}
}

// A command step spends nothing, but its Result is what the recorder
// records (and bills): it carries what earlier tries left unbilled.
func TestCommandStepBillsTheUnbilledSpend(t *testing.T) {
	e := newEnv(t, always(ok("x")), pipeline("", 0, "true"), nil)
	earlier := events.Usage{TokensIn: 120, TokensOut: 30, Cost: 0.0015}
	e.edit("t1", func(st *events.TaskState) {
		st.ID, st.Type, st.Status, st.Pass, st.Unbilled = "t1", "css_fix", events.StatusPending, 2, earlier
	})
	r := e.handleRun("t1", events.Run{Pass: 2, Attempt: 1, Step: "validate"}, nil).result(t)
	if r.Outcome != events.OutcomeSuccess || r.TokensIn != earlier.TokensIn || r.TokensOut != earlier.TokensOut || r.Cost != earlier.Cost {
		t.Fatalf("result %+v, want the step's success billing %+v", r, earlier)
	}
}
