package services_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

const patience = 30 * time.Second

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func setup(t *testing.T) *natstest.Server {
	t.Helper()
	s := natstest.Start(t)
	if _, err := services.Provision(context.Background(), s.JS, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	return s
}

// run starts a router for spec and returns a stop function that waits for it.
func run(t *testing.T, js jetstream.JetStream, spec services.Spec) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := &services.Router{JS: js, Instance: "test@here", Log: quiet, Grace: 10 * time.Second}
	go func() { done <- r.Run(ctx, spec) }()
	var once atomic.Bool
	stop = func() {
		if once.CompareAndSwap(false, true) {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("router: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// next waits for the next message on subject (a core subscription).
func subscribe(t *testing.T, nc *nats.Conn, subject string) func() *nats.Msg {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	return func() *nats.Msg {
		t.Helper()
		m, err := sub.NextMsg(patience)
		if err != nil {
			t.Fatalf("nothing on %s: %v", subject, err)
		}
		return m
	}
}

func publish(t *testing.T, js jetstream.JetStream, subject, data string) {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = []byte(data)
	msg.Header.Set(events.HeaderTaskID, "t1")
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

func spec(h services.Handler) services.Spec {
	return services.Spec{
		Name: "test", Filters: []string{events.StageFilter("in")}, Handler: h,
		MaxDeliver: 3, Backoff: func(int) time.Duration { return 10 * time.Millisecond },
	}
}

func TestRouterPublishesOutputsThenAcks(t *testing.T) {
	s := setup(t)
	out := subscribe(t, s.NC, events.StageFilter("out"))
	var calls atomic.Int32
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		calls.Add(1)
		o, err := services.Emit(events.TaskSubject("t1", "out"), "t1:1:out", "test.v1", "t1", map[string]string{"got": string(m.Data)})
		return []services.Out{o}, err
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "hello")
	m := out()
	if string(m.Data) != `{"got":"hello"}` || m.Header.Get(events.HeaderService) != "test@here" || m.Header.Get("Nats-Msg-Id") != "t1:1:out" {
		t.Fatalf("output %s %v", m.Data, m.Header)
	}
	// Acked: the consumer has nothing pending or outstanding.
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 && ci.NumPending == 0 })
	if calls.Load() != 1 {
		t.Fatalf("handler called %d times", calls.Load())
	}
}

// A handler's outputs before the last (what a recorded outcome adds to the
// history, the trust window, the spend counters) are all stored before the
// last one (the event that moves the task on) is published: whatever the
// last output wakes finds them. One marked WithLast (the task index) goes
// with the last one instead.
func TestRouterPublishesTheLastOutputLast(t *testing.T) {
	s := setup(t)
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		var outs []services.Out
		for i, stage := range []string{"with", "side0", "side1", "side2", "next"} {
			o, err := services.Emit(events.TaskSubject("t1", stage), fmt.Sprintf("t1:1:%d", i), "test.v1", "t1", i)
			if err != nil {
				return nil, err
			}
			o.WithLast = stage == "with"
			outs = append(outs, o)
		}
		return outs, nil
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
	// Acked (the router acks once every output is stored): a consumer
	// polled right after the publish may not count the message yet.
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool {
		return ci.NumAckPending == 0 && ci.NumPending == 0 && ci.AckFloor.Consumer >= 1
	})
	st, err := s.JS.Stream(context.Background(), services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	seq := map[string]uint64{}
	for _, stage := range []string{"with", "side0", "side1", "side2", "next"} {
		m, err := st.GetLastMsgForSubject(context.Background(), events.TaskSubject("t1", stage))
		if err != nil {
			t.Fatalf("output %s not stored: %v", stage, err)
		}
		seq[stage] = m.Sequence
	}
	for _, side := range []string{"side0", "side1", "side2"} {
		if seq[side] >= seq["next"] {
			t.Errorf("%s stored at %d, after the last output (%d)", side, seq[side], seq["next"])
		}
		// An output WithLast is sent with the last one, once the others
		// are stored, although the handler listed it first.
		if seq["with"] <= seq[side] {
			t.Errorf("the output WithLast stored at %d, before %s (%d)", seq["with"], side, seq[side])
		}
	}
}

// A redelivery's republish is answered as the duplicate of the very message
// it published before: that is "already stored" (Router.storedAs reads it
// back and finds it its own).
func TestRouterRepublishIsDeduplicated(t *testing.T) {
	s := setup(t)
	var calls atomic.Int32
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		o, _ := services.Emit(events.TaskSubject("t1", "out"), "t1:1:out", "test.v1", "t1", "x")
		if calls.Add(1) == 1 {
			// Publish succeeds, then the worker "fails" before it acks: the
			// retry republishes the same Msg-Id.
			if _, err := s.JS.PublishMsg(ctx, &nats.Msg{Subject: o.Subject, Header: o.Header, Data: o.Data}, jetstream.WithMsgID(o.MsgID)); err != nil {
				return nil, err
			}
			return nil, errors.New("crashed after publishing")
		}
		return []services.Out{o}, nil
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool {
		return ci.NumAckPending == 0 && ci.NumPending == 0 && calls.Load() == 2
	})
	st, _ := s.JS.Stream(context.Background(), services.Stream)
	info, _ := st.Info(context.Background(), jetstream.WithSubjectFilter(events.StageFilter("out")))
	if n := info.State.Subjects[events.TaskSubject("t1", "out")]; n != 1 {
		t.Fatalf("%d copies of the output stored, want 1", n)
	}
}

func TestRouterSnoozeRedelivers(t *testing.T) {
	s := setup(t)
	seen := make(chan int, 4)
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		seen <- m.Delivered
		if m.Delivered == 1 {
			return nil, services.Snooze(50*time.Millisecond, errors.New("rate limited"))
		}
		return nil, nil
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
	if a, b := <-seen, <-seen; a != 1 || b != 2 {
		t.Fatalf("deliveries %d, %d", a, b)
	}
}

func TestRouterDeadLettersWithOriginalBytes(t *testing.T) {
	s := setup(t)
	review := subscribe(t, s.NC, events.ReviewFilter)
	var calls atomic.Int32
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		calls.Add(1)
		return nil, services.Dead(events.ReviewRejected, errors.New("no good"))
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "\x00not json")
	m := review()
	if m.Subject != events.ReviewSubject(events.ReviewRejected, "t1") || string(m.Data) != "\x00not json" {
		t.Fatalf("review record %s %q", m.Subject, m.Data)
	}
	if m.Header.Get(events.HeaderError) != "no good" || m.Header.Get(events.HeaderOrigSubj) != events.TaskSubject("t1", "in") {
		t.Fatalf("headers %v", m.Header)
	}
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 })
	if calls.Load() != 1 {
		t.Fatalf("terminated message handled %d times", calls.Load())
	}
}

func TestRouterPoisonAfterMaxDeliver(t *testing.T) {
	s := setup(t)
	review := subscribe(t, s.NC, events.ReviewFilter)
	var calls atomic.Int32
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		if calls.Add(1) == 2 {
			panic("boom") // a panic is a failure like any other
		}
		return nil, fmt.Errorf("failure %d", m.Delivered)
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "payload")
	m := review()
	if m.Subject != events.ReviewSubject(events.ReviewPoison, "t1") || string(m.Data) != "payload" {
		t.Fatalf("poison record %s %q", m.Subject, m.Data)
	}
	if got := m.Header.Get(events.HeaderError); got != "failed 3 deliveries, last error: failure 3" {
		t.Fatalf("reason %q", got)
	}
	if calls.Load() != 3 {
		t.Fatalf("handled %d times, want MaxDeliver=3", calls.Load())
	}
}

// A worker that dies on the last delivery never dead-letters the message
// itself; the reaper catches the server's max-deliveries advisory.
func TestReaperKeepsMessagesWhoseWorkerDied(t *testing.T) {
	s := setup(t)
	review := subscribe(t, s.NC, events.ReviewFilter)
	run(t, s.JS, services.ReaperSpec(s.JS))
	ctx := context.Background()
	cons, err := s.JS.CreateOrUpdateConsumer(ctx, services.Stream, jetstream.ConsumerConfig{
		Durable: "doomed", FilterSubject: events.StageFilter("in"), AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 200 * time.Millisecond, MaxDeliver: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, s.JS, events.TaskSubject("t1", "in"), "lost soul")
	for range 2 { // take it twice, never settle it: a worker dying each time
		if _, err := cons.Next(jetstream.FetchMaxWait(patience)); err != nil {
			t.Fatal(err)
		}
	}
	// The server notices the exhausted message when a worker asks for more
	// (as live instances always do): that emits the advisory.
	if _, err := cons.Next(jetstream.FetchMaxWait(time.Second)); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("a message past MaxDeliver was delivered again: %v", err)
	}
	m := review()
	if m.Subject != events.ReviewSubject(events.ReviewPoison, "t1") || string(m.Data) != "lost soul" {
		t.Fatalf("reaped record %s %q", m.Subject, m.Data)
	}
}

func TestRouterShutdownFinishesInFlightWork(t *testing.T) {
	s := setup(t)
	out := subscribe(t, s.NC, events.StageFilter("out"))
	started, release := make(chan struct{}), make(chan struct{})
	stop := run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		close(started)
		<-release
		o, err := services.Emit(events.TaskSubject("t1", "out"), "t1:1:out", "test.v1", "t1", "done")
		return []services.Out{o}, err
	}))
	publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
	<-started
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }() // SIGTERM while the handler runs
	close(release)
	<-stopped
	if m := out(); string(m.Data) != `"done"` {
		t.Fatalf("output %q", m.Data)
	}
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 && ci.NumRedelivered == 0 })
}

// A router stopped before its consumer exists — its ctx done while the
// consumer is created — stops cleanly: nothing was in flight, so Run
// reports no error.
func TestRouterStoppedBeforeItStarted(t *testing.T) {
	s := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := &services.Router{JS: s.JS, Instance: "test@here", Log: quiet, Grace: time.Second}
	if err := r.Run(ctx, spec(func(context.Context, *services.Msg) ([]services.Out, error) {
		t.Error("a router stopped before it started handled a message")
		return nil, nil
	})); err != nil {
		t.Fatalf("Run with its ctx done: %v, want a clean stop", err)
	}
}

func TestExpBackoff(t *testing.T) {
	b := services.ExpBackoff(time.Second, 5*time.Second)
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 5 * time.Second, 40: 5 * time.Second} {
		if got := b(n); got != want {
			t.Errorf("backoff(%d) = %s, want %s", n, got, want)
		}
	}
}

func waitConsumer(t *testing.T, js jetstream.JetStream, name string, ok func(*jetstream.ConsumerInfo) bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		c, err := js.Consumer(context.Background(), services.StreamOf(name), name)
		if err == nil {
			if ci, err := c.Info(context.Background()); err == nil && ok(ci) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s never reached the expected state", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// OnDemand pulls one message per free worker; it handles everything and
// stops cleanly while a pull is waiting.
func TestRouterOnDemand(t *testing.T) {
	s := setup(t)
	out := subscribe(t, s.NC, events.StageFilter("out"))
	sp := spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		id, _, _ := events.ParseTaskSubject(m.Subject)
		o, err := services.Emit(events.TaskSubject(id, "out"), id+":1:out", "test.v1", id, "done")
		return []services.Out{o}, err
	})
	sp.OnDemand, sp.Concurrency = true, 1
	stop := run(t, s.JS, sp)
	for i := range 3 {
		publish(t, s.JS, events.TaskSubject(fmt.Sprintf("t%d", i), "in"), "x")
	}
	seen := map[string]bool{}
	for range 3 {
		seen[out().Subject] = true
	}
	if len(seen) != 3 {
		t.Fatalf("outputs %v", seen)
	}
	stop() // returns although a pull request is outstanding
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 && ci.NumPending == 0 })
}

// OnDemand hands a burst to every free worker at once, each message to one
// worker, and takes no more than it has workers for; Stop runs once the
// router returns.
func TestRouterOnDemandBurst(t *testing.T) {
	s := setup(t)
	const workers = 50
	release := make(chan struct{})
	var running, most atomic.Int32
	started := make(chan string, 2*workers)
	sp := spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		n := running.Add(1)
		for cur := most.Load(); n > cur && !most.CompareAndSwap(cur, n); cur = most.Load() {
		}
		started <- m.Subject
		<-release // a model call in flight
		running.Add(-1)
		return nil, nil
	})
	var stopped atomic.Bool
	sp.OnDemand, sp.Concurrency, sp.Stop = true, workers, func() { stopped.Store(true) }
	stop := run(t, s.JS, sp)
	for i := range workers + 10 {
		publish(t, s.JS, events.TaskSubject(fmt.Sprintf("t%d", i), "in"), "x")
	}
	seen := map[string]bool{}
	for range workers {
		seen[<-started] = true
	}
	if len(seen) != workers {
		t.Fatalf("%d distinct messages started, want %d", len(seen), workers)
	}
	// Every worker is busy: the rest wait on the server, none delivered.
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool {
		return ci.NumAckPending == workers && ci.NumPending == 10
	})
	close(release)
	for range 10 {
		<-started
	}
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 && ci.NumPending == 0 })
	stop()
	if most.Load() > workers {
		t.Fatalf("%d handlers ran at once, concurrency %d", most.Load(), workers)
	}
	if !stopped.Load() {
		t.Fatal("Spec.Stop was not called")
	}
}

// The heartbeat keeps messages whose handlers run for several AckWaits
// from being redelivered, for every message in flight at once.
func TestRouterHeartbeatKeepsLongHandlers(t *testing.T) {
	for _, onDemand := range []bool{false, true} {
		t.Run(fmt.Sprintf("OnDemand=%v", onDemand), func(t *testing.T) {
			s := setup(t)
			const n = 20
			var calls atomic.Int32
			redelivered := make(chan int, n)
			sp := spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
				calls.Add(1)
				if m.Delivered > 1 {
					redelivered <- m.Delivered
				}
				time.Sleep(3 * time.Second) // 3 AckWaits
				return nil, nil
			})
			sp.Name = fmt.Sprintf("beat%v", onDemand)
			// An AckWait long enough that a busy machine's scheduling
			// stalls do not eat a whole one between two heartbeats.
			sp.AckWait, sp.Concurrency, sp.OnDemand = time.Second, n, onDemand
			run(t, s.JS, sp)
			for i := range n {
				publish(t, s.JS, events.TaskSubject(fmt.Sprintf("t%d", i), "in"), "x")
			}
			waitConsumer(t, s.JS, sp.Name, func(ci *jetstream.ConsumerInfo) bool {
				return ci.NumAckPending == 0 && ci.NumPending == 0 && ci.Delivered.Consumer >= n
			})
			select {
			case d := <-redelivered:
				t.Fatalf("a message was redelivered (delivery %d) while its handler ran", d)
			default:
			}
			if c := calls.Load(); c != n {
				t.Fatalf("%d handler calls, want %d", c, n)
			}
		})
	}
}

// A handler still running when the grace period ends has its context
// cancelled; the message is handed back and the next instance gets it.
func TestRouterGraceExpiryHandsMessageBack(t *testing.T) {
	s := setup(t)
	started := make(chan struct{})
	var once sync.Once
	stuck := spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		once.Do(func() { close(started) })
		<-ctx.Done() // a model call that would not finish in time
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- (&services.Router{JS: s.JS, Log: quiet, Grace: 50 * time.Millisecond}).Run(ctx, stuck)
	}()
	publish(t, s.JS, events.TaskSubject("t1", "in"), "x")
	<-started
	cancel() // SIGTERM
	if err := <-done; err != nil {
		t.Fatalf("router: %v", err)
	}

	got := make(chan int, 1)
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		got <- m.Delivered
		return nil, nil
	}))
	if n := <-got; n != 2 {
		t.Fatalf("the handed-back message came as delivery %d, want 2", n)
	}
}

// Prefetch keeps that many messages pulled ahead of one busy worker, and
// every one of them is still handled, once each.
func TestRouterPrefetch(t *testing.T) {
	s := setup(t)
	out := subscribe(t, s.NC, events.StageFilter("out"))
	release := make(chan struct{})
	free := sync.OnceFunc(func() { close(release) })
	sp := spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		<-release
		id, _, _ := events.ParseTaskSubject(m.Subject)
		o, err := services.Emit(events.TaskSubject(id, "out"), id+":1:out", "test.v1", id, "done")
		return []services.Out{o}, err
	})
	sp.Concurrency, sp.Prefetch = 1, 10
	run(t, s.JS, sp)
	t.Cleanup(free) // before the router stops, should the test fail
	for i := range 15 {
		publish(t, s.JS, events.TaskSubject(fmt.Sprintf("t%d", i), "in"), "x")
	}
	// One message in the handler, the rest of the ten delivered and waiting.
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 10 && ci.NumPending == 5 })
	free()
	seen := map[string]bool{}
	for range 15 {
		seen[out().Subject] = true
	}
	if len(seen) != 15 {
		t.Fatalf("outputs %v", seen)
	}
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 && ci.NumPending == 0 })
}

// A router whose consumer is deleted stops and says so, buffered or
// OnDemand, instead of asking for messages for ever.
func TestRouterStopsWhenItsConsumerIsDeleted(t *testing.T) {
	for _, onDemand := range []bool{false, true} {
		t.Run(fmt.Sprintf("OnDemand=%v", onDemand), func(t *testing.T) {
			s := setup(t)
			sp := spec(func(context.Context, *services.Msg) ([]services.Out, error) { return nil, nil })
			sp.OnDemand = onDemand
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stats := &services.RunStats{}
			r := &services.Router{JS: s.JS, Instance: "test@here", Log: quiet, Grace: time.Second, Stats: stats}
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx, sp) }()
			waitConsumer(t, s.JS, "test", func(*jetstream.ConsumerInfo) bool { return stats.Running() })
			if err := s.JS.DeleteConsumer(context.Background(), services.Stream, "test"); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "stopped consuming") {
					t.Fatalf("Run returned %v, want it to say it stopped consuming", err)
				}
			case <-time.After(time.Minute): // a deadlock guard, not a timing assertion
				t.Fatal("Run still consuming a minute after its consumer was deleted")
			}
		})
	}
}
