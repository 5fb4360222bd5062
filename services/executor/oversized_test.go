package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// A model that answers with a 3 MB summary is paid once: the answer is
// capped, its Executed stored through the router on a real stream (the
// servers' max_payload is 1 MB), and the attempt ends normally — no
// publish failure, no redelivery, no second call.
func TestAnOversizedAnswerIsStoredAndPaidOnce(t *testing.T) {
	ns := natstest.Start(t)
	ctx := t.Context()
	stores, err := services.Provision(ctx, ns.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	summary := strings.Repeat("the selector is generated at build time <so> regenerate it; ", 3<<20/60)
	content, err := json.Marshal(map[string]any{
		"status": "success", "approach": strings.Repeat("regenerate the stylesheet ", 200),
		"summary": summary, "changes": []string{"app.css", strings.Repeat("x", 100<<10)},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, always(openaitest.Reply{Content: string(content)}), policy.Type{}, func(c *executor.Config) {
		c.Tasks, c.NATS = services.NewTaskStore(stores.Tasks), ns.NC
	})
	router := &services.Router{JS: ns.JS, Instance: "executor@test", Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- router.Run(rctx, services.Spec{
			Name: services.ConsumerExecutor, Filters: []string{events.StageFilter(events.StagePrompted)},
			Handler: e.Handle, OnDemand: true, MaxDeliver: 3, Stop: e.Close,
			Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		})
	}()
	t.Cleanup(func() { stop(); <-done })

	base := events.Base{
		Task: events.Task{ID: "t1", Type: "css_fix", Subject: "app.css"},
		Run:  events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Step: events.StepExecute},
		At:   testNow, By: "prompt@test",
	}
	in, err := services.Next(base, events.StagePrompted, events.EventPrompted, events.Prompted{Base: base, Prompt: events.Prompt{Messages: testMessages}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ns.JS.PublishMsg(ctx, services.NatsMsg(in), jetstream.WithMsgID(in.MsgID)); err != nil {
		t.Fatal(err)
	}

	// The prompted message is settled: acked once its Executed is stored
	// (or, were the Executed unpublishable, terminated after MaxDeliver).
	var info *jetstream.ConsumerInfo
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		cons, err := ns.JS.Consumer(ctx, services.Stream, services.ConsumerExecutor)
		if err == nil {
			info, err = cons.Info(ctx)
		}
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatal(err)
		}
		if info != nil && info.AckFloor.Stream > 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the prompted message is not settled: %+v", info)
		}
	}
	stream, err := ns.JS.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetLastMsgForSubject(ctx, events.TaskSubject("t1", events.StageExecuted))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("no Executed stored; the model was called %d times", e.model.Calls())
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := e.model.Calls(); n != 1 || info.NumRedelivered != 0 || info.Delivered.Consumer != 1 {
		t.Fatalf("model called %d times, %d deliveries (%d redelivered); want one call on one delivery",
			n, info.Delivered.Consumer, info.NumRedelivered)
	}
	var ev events.Executed
	if err := json.Unmarshal(raw.Data, &ev); err != nil {
		t.Fatal(err)
	}
	r := ev.Result
	if r.Outcome != events.OutcomeSuccess || r.TokensIn == 0 {
		t.Fatalf("result %+v, want the paid success", r)
	}
	for _, f := range []struct {
		name, got string
		max       int
	}{{"summary", r.Summary, events.MaxSummary}, {"approach", r.Approach, events.MaxApproach}, {"change", r.Changes[1], events.MaxChange}} {
		start, _, cut := strings.Cut(f.got, "… [cut: ")
		if len(f.got) > f.max || !cut || !strings.HasSuffix(f.got, " bytes more]") || start == "" {
			t.Errorf("%s of %d bytes = %.60q…; want at most %d bytes, its cut marked", f.name, len(f.got), f.got, f.max)
		}
	}
	if !strings.HasPrefix(summary, strings.SplitN(r.Summary, "…", 2)[0]) || r.Changes[0] != "app.css" {
		t.Errorf("the capped answer is not the start of the model's: %.80q, %q", r.Summary, r.Changes[0])
	}
	if len(raw.Data) > executor.MaxExecuted {
		t.Errorf("Executed of %d bytes, over %d", len(raw.Data), executor.MaxExecuted)
	}
}

// An answer that leaves its Executed over MaxExecuted — the task's own
// payload takes most of the room — is cut tighter rather than lost.
func TestAnAnswerBesideALargeTaskIsCutTighter(t *testing.T) {
	answer, err := json.Marshal(map[string]any{
		"status": "failure", "approach": strings.Repeat("a", 4<<10), "summary": strings.Repeat("<s>", 4<<10),
		"changes": strings.Fields(strings.Repeat(strings.Repeat("c", 600)+" ", 40)),
	})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, always(openaitest.Reply{Content: string(answer)}), policy.Type{}, nil)
	payload, _ := json.Marshal(map[string]string{"file": strings.Repeat("p", 700<<10)})
	in := events.Prompted{
		Base: events.Base{
			Task: events.Task{ID: "t1", Type: "css_fix", Subject: "app.css", Payload: payload},
			Run:  events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Step: events.StepExecute}, At: testNow, By: "prompt@test",
		},
		Prompt: events.Prompt{Messages: testMessages},
	}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := e.Handle(t.Context(), &services.Msg{Subject: events.TaskSubject("t1", events.StagePrompted), Data: data, Delivered: 1})
	r := handled{outs, err}.result(t)
	if n := len(outs[0].Data); n > 900<<10 {
		t.Fatalf("Executed of %d bytes, too close to the servers' max_payload (1 MB)", n)
	}
	if len(r.Approach) > 512 || len(r.Summary) > 1<<10 || len(r.Error) > 1<<10 || len(r.Changes) > 8 || r.Outcome != events.OutcomeFailure {
		t.Fatalf("answer kept %d bytes of approach, %d of summary, %d of error, %d changes; want the tight caps",
			len(r.Approach), len(r.Summary), len(r.Error), len(r.Changes))
	}
	if !strings.HasSuffix(r.Summary, " bytes more]") {
		t.Fatalf("the summary's cut is not marked: …%q", r.Summary[max(0, len(r.Summary)-40):])
	}
}

// A run whose 32 dead ends are full of characters JSON escapes as six
// bytes, beside a large task, still leaves an Executed that can be
// stored: the dead ends it carries are cut too. A task too large even
// then ends its attempt in review after one call, never paid again.
func TestDeadEndsBesideALargeTaskAreCutOrTheAttemptEnds(t *testing.T) {
	answer, _ := json.Marshal(map[string]any{"status": "failure", "approach": "x", "summary": "y"})
	var deadEnds []events.DeadEnd
	for i := range 32 {
		deadEnds = append(deadEnds, events.DeadEnd{Approach: strings.Repeat("<", events.MaxApproach), Reason: strings.Repeat(">", events.MaxApproach), Attempt: i + 1, Rung: events.RungRefine})
	}
	for _, tc := range []struct {
		name    string
		payload int
		stored  bool
	}{{"large task", 200 << 10, true}, {"too large even then", 1000 << 10, false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, always(openaitest.Reply{Content: string(answer)}), policy.Type{}, nil)
			payload, _ := json.Marshal(map[string]string{"file": strings.Repeat("p", tc.payload)})
			in := events.Prompted{
				Base: events.Base{
					Task: events.Task{ID: "t1", Type: "css_fix", Subject: "app.css", Payload: payload},
					Run:  events.Run{Pass: 33, Attempt: 33, Rung: events.RungResearch, Step: events.StepExecute, DeadEnds: deadEnds}, At: testNow, By: "prompt@test",
				},
				Prompt: events.Prompt{Messages: testMessages},
			}
			data, err := json.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			outs, err := e.Handle(t.Context(), &services.Msg{Subject: events.TaskSubject("t1", events.StagePrompted), Data: data, Delivered: 1})
			if !tc.stored {
				var dead *services.DeadError
				if !errors.As(err, &dead) || e.model.Calls() != 1 {
					t.Fatalf("err %v after %d calls; want a dead letter after one call", err, e.model.Calls())
				}
				return
			}
			if err != nil || len(outs) != 1 {
				t.Fatalf("%d outputs, %v", len(outs), err)
			}
			if n := len(outs[0].Data); n > executor.MaxExecuted {
				t.Fatalf("Executed of %d bytes, over %d", n, executor.MaxExecuted)
			}
			var ev events.Executed
			if err := json.Unmarshal(outs[0].Data, &ev); err != nil {
				t.Fatal(err)
			}
			if len(ev.Run.DeadEnds) != 32 || len(ev.Run.DeadEnds[0].Approach) > 256 || !strings.HasSuffix(ev.Run.DeadEnds[0].Reason, " bytes more]") {
				t.Fatalf("dead ends: %d, the first %d bytes of approach, reason …%q", len(ev.Run.DeadEnds), len(ev.Run.DeadEnds[0].Approach), ev.Run.DeadEnds[0].Reason[max(0, len(ev.Run.DeadEnds[0].Reason)-30):])
			}
		})
	}
}
