package mesh_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// floodTasks is how many tasks of a brand-new type BenchmarkFlood
// submits at once, and floodEvery how many of them go between two tasks
// of the trusted type.
const (
	floodTasks = 20000
	floodEvery = 500
)

// BenchmarkFlood measures fair admission: a flood of a type the mesh has
// never seen arrives beside a type it trusts, and each trusted task's wait
// at the gate is the time from its verified event (its arrival at the
// gate's stream position) to its admitted event, both as seen by a
// subscriber in this process. The flood's canaries take 2 s at the model,
// so every other flood task waits for their evidence while the trusted
// tasks pass. A second new type's tasks, answered at once, wait for their
// own canaries' evidence: new-type-max-gate-wait-s is the longest (its
// canaries queue in the executor behind the flood once the flood's type is
// decided: minutes, see docs/benchmarks.md).
//
//	go test -run '^$' -bench Flood -benchtime 1x ./internal/mesh/
func BenchmarkFlood(b *testing.B) {
	model := openaitest.New(b, func(_ int, r openaitest.Request) openaitest.Reply {
		if bytes.Contains(r.Body, []byte("flood")) {
			time.Sleep(2 * time.Second)
		}
		return openaitest.Reply{Content: openaitest.Success("fix the selector")}
	})
	srv := startModelMesh(b, model, floodConcurrency(), policy.Static(&policy.File{}))
	done := countOn(b, srv.NC, events.StageFilter(events.StageSucceeded))
	// The trusted type earns its trust first: its canaries, then the rest
	// of a scoring sample.
	const warm = 2 * trust.DefaultMinOutcomes
	for i := range warm {
		submitModelTask(b, srv, "trusted", fmt.Sprintf("warm%d", i), i)
	}
	done.wait(b, warm)

	admitted := &counter{}
	seen := map[string]bool{} // a redelivered stage publishes again
	sub, err := srv.NC.Subscribe(events.StageFilter(events.StageAdmitted), func(m *nats.Msg) {
		if id := strings.Split(m.Subject, ".")[2]; (strings.HasPrefix(id, "steady") || strings.HasPrefix(id, "fresh")) && !seen[id] {
			seen[id] = true
			admitted.n.Add(1)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	// A second new type arrives during the flood, its tasks answered at
	// once: its canaries go through, the rest wait for their evidence in
	// the held consumer, where the flood's waits are too.
	var ids, fresh []string
	b.ResetTimer()
	for n := range b.N {
		for i := range floodTasks {
			if i%floodEvery == 0 {
				// A subject of its own: a task on a subject another task
				// of its type still holds waits for that one to end.
				id := fmt.Sprintf("steady%d_%d", n, i)
				submitModelTask(b, srv, "trusted", id, 100+i/floodEvery)
				ids = append(ids, id)
			}
			if i == floodTasks/2 { // a burst: more than its canaries
				for j := range 2 * trust.DefaultMinOutcomes {
					id := fmt.Sprintf("fresh%d_%d", n, j)
					submitModelTask(b, srv, fmt.Sprintf("fresh%d", n), id, 200+j)
					fresh = append(fresh, id)
				}
			}
			submitFloodTask(b, srv, fmt.Sprintf("flood%d_%d", n, i), i)
		}
		admitted.wait(b, len(ids)+len(fresh))
	}
	b.StopTimer()
	w := gateWaits(b, srv, ids)
	slices.Sort(w)
	b.ReportMetric(w[len(w)/2].Seconds(), "p50-gate-wait-s")
	b.ReportMetric(w[len(w)*9/10].Seconds(), "p90-gate-wait-s")
	b.ReportMetric(w[len(w)-1].Seconds(), "max-gate-wait-s")
	f := gateWaits(b, srv, fresh)
	b.ReportMetric(slices.Max(f).Seconds(), "new-type-max-gate-wait-s")
}

// submitFloodTask submits id of the flood type; its payload names the
// flood, so the scripted model can tell its prompts apart.
func submitFloodTask(b testing.TB, srv *natstest.Server, id string, n int) {
	data := fmt.Appendf(nil, `{"id":"%s","subject":"src/flood%d.css","payload":{"issue":"flood","n":"#%d#"}}`, id, n%1000, n)
	for {
		_, err := srv.JS.PublishAsync(events.SubmitSubject("flood"), data)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			if err != nil {
				b.Fatal(err)
			}
			return
		}
		// The server acks slower than the flood is published (a busy
		// machine): wait for the outstanding acks, then go on.
		select {
		case <-srv.JS.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("the flood's publish acks never came")
		}
	}
}

// gateWaits is each task's wait at the gate: from its verified event's
// arrival on the stream (its place in the gate's queue) to its admitted
// event's, both as the stream stamped them.
func gateWaits(b testing.TB, srv *natstest.Server, ids []string) []time.Duration {
	ctx := context.Background()
	stream, err := srv.JS.Stream(ctx, events.Stream)
	if err != nil {
		b.Fatal(err)
	}
	var waits []time.Duration
	for _, id := range ids {
		v, err := stream.GetLastMsgForSubject(ctx, events.TaskSubject(id, events.StageVerified))
		if err != nil {
			b.Fatalf("%s verified: %v", id, err)
		}
		a, err := stream.GetLastMsgForSubject(ctx, events.TaskSubject(id, events.StageAdmitted))
		if err != nil {
			b.Fatalf("%s admitted: %v", id, err)
		}
		waits = append(waits, a.Time.Sub(v.Time))
	}
	return waits
}

func floodConcurrency() map[string]int {
	c := map[string]int{mesh.Executor: 64}
	if n, err := strconv.Atoi(os.Getenv("FLOOD_GATE")); err == nil {
		c[mesh.Gate] = n
	}
	return c
}
