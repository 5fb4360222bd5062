package mesh_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// patience bounds every wait for the mesh to do something. It is a deadlock
// guard, not a timing assertion.
const patience = 60 * time.Second

// env is one embedded server plus the fake model.
type env struct {
	t     *testing.T
	srv   *natstest.Server
	model *openaitest.Server
	pol   *policy.Source
	tasks *services.TaskStore
}

func newEnv(t *testing.T, script openaitest.Script, pol *policy.File) *env {
	t.Helper()
	e := &env{t: t, srv: natstest.Start(t), model: openaitest.New(t, script), pol: policy.Static(pol)}
	return e
}

// start runs the given services (all when none) on their own connection and
// returns a stop function that drains them. AckWait is short so a crashed
// worker's message comes back quickly.
func (e *env) start(names ...string) (stop func()) {
	e.t.Helper()
	nc, _ := e.srv.Connect(e.t)
	return e.startOn(nc, names...)
}

func (e *env) startOn(nc *nats.Conn, names ...string) (stop func()) {
	e.t.Helper()
	return e.startWith(nc, mesh.Options{
		Services: names,
		Model:    executor.NewOpenAI(executor.OpenAIConfig{BaseURL: e.model.BaseURL(), APIKey: "test"}),
		AckWait:  2 * time.Second,
	})
}

// startWith runs the mesh with o on nc, completed with the env's policy, a
// quiet log and a 5 s grace; stop drains it (at the end of the test at the
// latest).
func (e *env) startWith(nc *nats.Conn, o mesh.Options) (stop func()) {
	e.t.Helper()
	o.NC, o.Policy, o.Provision, o.Log, o.Grace = nc, e.pol, true, quiet, 5*time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mesh.Run(ctx, o) }()
	e.waitProvisioned(done)
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("mesh stopped with %v", err)
		}
	}
	e.t.Cleanup(stop)
	return stop
}

// waitProvisioned waits until the task bucket exists; done is the mesh's
// end, which fails the test at once when the mesh stopped first.
func (e *env) waitProvisioned(done chan error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for {
		// Each look is bounded on its own: one request the server never
		// answers must not use up the whole patience.
		look, stop := context.WithTimeout(ctx, 5*time.Second)
		kv, err := e.srv.JS.KeyValue(look, services.BucketTasks)
		stop()
		if err == nil {
			e.tasks = services.NewTaskStore(kv)
			return
		}
		select {
		case err := <-done:
			done <- err // for whoever waits for the mesh's end
			e.t.Fatalf("mesh stopped before it provisioned: %v", err)
		default:
		}
		if ctx.Err() != nil {
			e.t.Fatalf("mesh never provisioned: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// submit publishes raw bytes on dispatch.submit.<type> like any client.
func (e *env) submitRaw(taskType string, data []byte) {
	e.t.Helper()
	if _, err := e.srv.JS.Publish(context.Background(), events.SubmitSubject(taskType), data); err != nil {
		e.t.Fatalf("publish: %v", err)
	}
}

func (e *env) submit(s events.Submit) string {
	e.t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		e.t.Fatal(err)
	}
	e.submitRaw(s.Type, data)
	return s.ID
}

// waitEnd follows the task's events until it ends and returns them all.
func (e *env) waitEnd(id string) []timeline.Entry {
	e.t.Helper()
	return e.follow(id, "ended", func(en timeline.Entry) bool { final, _ := en.Final(); return final })
}

// waitStage waits for the task's first event of stage and returns every
// event up to it.
func (e *env) waitStage(id, stage string) []timeline.Entry {
	e.t.Helper()
	return e.follow(id, "reached "+stage, func(en timeline.Entry) bool { return en.Stage == stage })
}

// waitSettled waits until the task ended, or is held for its type's
// trust (its held event seen with its state held: the gate writes the
// state first), and returns its events up to then.
func (e *env) waitSettled(id string) []timeline.Entry {
	e.t.Helper()
	return e.follow(id, "settled", func(en timeline.Entry) bool {
		if final, _ := en.Final(); final {
			return true
		}
		return en.Stage == events.StageHeld && e.state(id).Status == events.StatusHeld
	})
}

// follow returns the task's events up to the first that done accepts.
func (e *env) follow(id, what string, done func(timeline.Entry) bool) []timeline.Entry {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var all []timeline.Entry
	err := timeline.Follow(ctx, e.srv.JS, id, true, func(en timeline.Entry) bool {
		all = append(all, en)
		return !done(en)
	})
	if err != nil {
		e.t.Fatalf("task %s never %s (%v); events: %v", id, what, err, timeline.Stages(all))
	}
	return all
}

// events returns every event of the task stored so far.
func (e *env) events(id string) []timeline.Entry {
	e.t.Helper()
	var all []timeline.Entry
	err := timeline.Follow(context.Background(), e.srv.JS, id, false, func(en timeline.Entry) bool {
		all = append(all, en)
		return true
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return all
}

func (e *env) state(id string) events.TaskState {
	e.t.Helper()
	st, err := e.tasks.Get(context.Background(), id)
	if err != nil {
		e.t.Fatalf("state of %s: %v", id, err)
	}
	return st
}

// reviews reads every record on dispatch.review.<reason>.>.
func (e *env) reviews(reason string) []*nats.Msg {
	e.t.Helper()
	ctx := context.Background()
	cons, err := e.srv.JS.OrderedConsumer(ctx, services.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.ReviewRoot + "." + reason + ".>"},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*nats.Msg
	for uint64(len(out)) < info.NumPending {
		m, err := cons.Next(jetstream.FetchMaxWait(patience))
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	}
	return out
}

// waitReviews waits until n records are on dispatch.review.<reason>.>.
func (e *env) waitReviews(reason string, n int) []*nats.Msg {
	e.t.Helper()
	deadline := time.Now().Add(patience)
	for {
		got := e.reviews(reason)
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("want %d %s review records, have %d", n, reason, len(got))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func last(all []timeline.Entry) timeline.Entry {
	if len(all) == 0 {
		return timeline.Entry{}
	}
	return all[len(all)-1]
}

func succeed(int, openaitest.Request) openaitest.Reply {
	return openaitest.Reply{Content: openaitest.Success("fix the selector")}
}

func fail(n int, _ openaitest.Request) openaitest.Reply {
	return openaitest.Reply{Content: openaitest.Failure("approach "+strings.Repeat("x", n%3), "still broken")}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
