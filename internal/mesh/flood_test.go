package mesh_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// A flood of a type the mesh has never seen, far more tasks than any
// consumer may hold pending, arrives before a trusted type's tasks. The
// flood's canaries never answer until the trusted tasks have ended: the
// trusted tasks can only end if no stage holds the flood's waits in its
// pending slots (BenchmarkFlood measures how long they wait at the gate).
// Then the flood's evidence comes in and every flood task ends.
func TestFloodOfANewTypeHoldsNoSlots(t *testing.T) {
	const (
		pending = 32 // every consumer's MaxAckPending, lowered
		flood   = 20 * pending
	)
	release := make(chan struct{})
	var floodCalls atomic.Int64
	e := newEnv(t, func(_ int, r openaitest.Request) openaitest.Reply {
		if bytes.Contains(r.Body, []byte("flood")) {
			floodCalls.Add(1)
			<-release
		}
		return openaitest.Reply{Content: openaitest.Success("fix the selector")}
	}, nil)
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open) // before the model server closes
	nc, _ := e.srv.Connect(t)
	e.startWith(nc, mesh.Options{
		Model:         executor.NewOpenAI(executor.OpenAIConfig{BaseURL: e.model.BaseURL(), APIKey: "test"}),
		AckWait:       2 * time.Second,
		MaxAckPending: pending,
	})
	succeeded := countOn(t, nc, events.StageFilter(events.StageSucceeded))
	held := countOn(t, nc, events.StageFilter(events.StageHeld))

	trusted := func(id string, n int) string {
		return e.submit(events.Submit{ID: id, Type: "trusted", Subject: fmt.Sprintf("src/t%d.css", n), Payload: []byte(`{"issue":"button"}`)})
	}
	for i := range 2 * trust.DefaultMinOutcomes {
		e.waitEnd(trusted(fmt.Sprintf("warm%d", i), i))
	}
	for i := range flood {
		e.submit(events.Submit{ID: fmt.Sprintf("flood%d", i), Type: "flood", Subject: fmt.Sprintf("src/f%d.css", i), Payload: []byte(`{"issue":"flood"}`)})
	}
	for i := range 5 {
		id := trusted(fmt.Sprintf("steady%d", i), 100+i)
		e.waitEnd(id)
		if st := e.state(id); st.Status != events.StatusSucceeded {
			t.Fatalf("%s behind the flood: %s", id, st.Status)
		}
	}
	if n := floodCalls.Load(); n == 0 || n > int64(trust.DefaultMinOutcomes) {
		t.Fatalf("%d flood tasks reached the model while its canaries ran", n)
	}
	if n := held.n.Load(); n < flood-int64(trust.DefaultMinOutcomes) {
		t.Fatalf("only %d flood tasks waited for the canaries", n)
	}
	// While they wait, they sleep in the held index: once gate_held has
	// looked at every held event, no consumer holds one of them.
	waitFor(t, "the flood's waits asleep in the held index, none pending in gate_held", func() bool {
		c, err := e.srv.JS.Consumer(context.Background(), services.Stream, services.ConsumerGateHeld)
		if err != nil {
			return false
		}
		ci, err := c.Info(context.Background())
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
	open()
	succeeded.wait(t, 2*trust.DefaultMinOutcomes+5+flood)
}
