package services_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

const (
	inTrace = "0af7651916cd43dd8448eb211c80319c"
	inSpan  = "b7ad6b7169203331"
)

// runTraced starts a router with a tracer whose spans land in the
// returned exporter as each one ends.
func runTraced(t *testing.T, js jetstream.JetStream, spec services.Spec) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := &services.Router{JS: js, Instance: "test@here", Log: quiet, Grace: 10 * time.Second, Tracer: tp.Tracer("test")}
	go func() { done <- r.Run(ctx, spec) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	})
	return exp
}

func publishTraced(t *testing.T, js jetstream.JetStream, subject, data string) {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = []byte(data)
	msg.Header.Set(events.HeaderTaskID, "t1")
	msg.Header.Set("traceparent", "00-"+inTrace+"-"+inSpan+"-01")
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

func attrs(s tracetest.SpanStub) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

// A message handled twice (a failure, then a success) is two spans of the
// trace its traceparent names, the failure recorded on the first; the
// output carries the second span's trace context to the next stage.
func TestTracingCarriesTheTraceToOutputs(t *testing.T) {
	s := setup(t)
	out := subscribe(t, s.NC, events.StageFilter("out"))
	var calls atomic.Int32
	exp := runTraced(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		if calls.Add(1) == 1 {
			return nil, errors.New("first try fails")
		}
		o, err := services.Next(events.Base{Task: events.Task{ID: "t1"}, Run: events.Run{Pass: 2}}, "out", "test.v1", map[string]string{"cause": "probe"})
		return []services.Out{o}, err
	}))
	publishTraced(t, s.JS, events.TaskSubject("t1", "in"), `{"task":{"id":"t1","type":"css_fix"},"run":{"pass":2,"attempt":2,"rung":"REFINE"}}`)
	m := out()
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 })

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	for i, sp := range spans {
		if sp.Name != "test" || sp.SpanKind != trace.SpanKindConsumer || sp.Parent.TraceID().String() != inTrace || sp.Parent.SpanID().String() != inSpan {
			t.Errorf("span %d: %s %v, parent %v: want a consumer span under the traceparent", i, sp.Name, sp.SpanKind, sp.Parent)
		}
		a := attrs(sp)
		if a[services.AttrTaskID] != "t1" || a[services.AttrTaskType] != "css_fix" || a[services.AttrPass] != "2" ||
			a[services.AttrAttempt] != "2" || a[services.AttrRung] != "REFINE" {
			t.Errorf("span %d attributes %v", i, a)
		}
	}
	first, second := spans[0], spans[1]
	if a := attrs(first); first.Status.Code != codes.Error || a[services.AttrResult] != "retried" || a[services.AttrDelivery] != "1" || len(first.Events) == 0 {
		t.Errorf("the failed delivery's span: status %v, attributes %v, events %v", first.Status, a, first.Events)
	}
	if a := attrs(second); second.Status.Code == codes.Error || a[services.AttrFate] != "ack" || a[services.AttrNext] != "out" || a[services.AttrCause] != "probe" {
		t.Errorf("the second delivery's span: status %v, attributes %v", second.Status, a)
	}
	want := "00-" + inTrace + "-" + second.SpanContext.SpanID().String() + "-01"
	if got := m.Header.Get("traceparent"); got != want {
		t.Errorf("output traceparent %q, want %q (the span that published it)", got, want)
	}
}

// A dead-letter record is published under the span of the message it
// keeps.
func TestTracingDeadLetterInTheTrace(t *testing.T) {
	s := setup(t)
	review := subscribe(t, s.NC, events.ReviewFilter)
	exp := runTraced(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		return nil, services.Dead(events.ReviewRejected, errors.New("no good"))
	}))
	publishTraced(t, s.JS, events.TaskSubject("t1", "in"), "\x00not json")
	m := review()
	waitConsumer(t, s.JS, "test", func(ci *jetstream.ConsumerInfo) bool { return ci.NumAckPending == 0 })
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	if a := attrs(spans[0]); spans[0].Status.Code != codes.Error || a[services.AttrResult] != "dead" || a[services.AttrFate] != "term" {
		t.Errorf("dead message's span: %v %v", spans[0].Status, a)
	}
	want := "00-" + inTrace + "-" + spans[0].SpanContext.SpanID().String() + "-01"
	if got := m.Header.Get("traceparent"); got != want {
		t.Errorf("review record's traceparent %q, want %q", got, want)
	}
}

// Without a tracer the router makes no span and adds no trace context.
func TestTracingOff(t *testing.T) {
	s := setup(t)
	out := subscribe(t, s.NC, events.StageFilter("out"))
	run(t, s.JS, spec(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
		if trace.SpanFromContext(ctx).IsRecording() {
			t.Error("a recording span with tracing off")
		}
		o, err := services.Next(events.Base{Task: events.Task{ID: "t1"}, Run: events.Run{Pass: 1}}, "out", "test.v1", struct{}{})
		return []services.Out{o}, err
	}))
	publishTraced(t, s.JS, events.TaskSubject("t1", "in"), `{}`)
	if m := out(); m.Header.Get("traceparent") != "" {
		t.Errorf("traceparent %q with tracing off", m.Header.Get("traceparent"))
	}
}

// FuzzTracingSpan: whatever a message and its handler's output hold (a
// client's submission, a body that is not JSON, a traceparent of any
// shape), the span is made, named after the service, and the handler's
// outputs and error pass through unchanged.
func FuzzTracingSpan(f *testing.F) {
	f.Add("dispatch.submit.css_fix", `{"id":"a","type":"css_fix"}`, "dispatch.task.a.retry", `{"cause":"x","result":{"outcome":"failure","tokens_in":3}}`, "00-"+inTrace+"-"+inSpan+"-01")
	f.Add("dispatch.task.a.executed", `{"task":{"id":"a","type":7},"run":{"pass":"x"}}`, "dispatch.review.poison.a", `[1,2]`, "garbage")
	f.Add("x", "\x00", "", "", "")
	f.Fuzz(func(t *testing.T, subject, data, outSubject, outData, tp string) {
		exp := tracetest.NewInMemoryExporter()
		// Every span sampled: a valid traceparent whose flags say "not
		// sampled" would otherwise, rightly, leave no span to check
		// (the default sampler follows the caller's decision).
		tp2 := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
		defer func() { _ = tp2.Shutdown(context.Background()) }()
		failure := errors.New("handler failed")
		h := services.Tracing(tp2.Tracer("fuzz"), "svc")(func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
			return []services.Out{{Subject: outSubject, Data: []byte(outData)}}, failure
		})
		m := &services.Msg{Subject: subject, Data: []byte(data), Header: nats.Header{"traceparent": {tp}}, Delivered: 1}
		outs, err := h(context.Background(), m)
		if !errors.Is(err, failure) || len(outs) != 1 || outs[0].Subject != outSubject || string(outs[0].Data) != outData {
			t.Fatalf("the handler's result changed: %v, %v", outs, err)
		}
		if spans := exp.GetSpans(); len(spans) != 1 || spans[0].Name != "svc" || spans[0].Status.Code != codes.Error {
			t.Fatalf("spans %v", spans)
		}
	})
}

// The Tracing middleware's cost per message, in memory: "off" (no
// tracer) is the handler alone; "on" makes the span, reads the task's
// attributes from an Executed-sized message and its output, and batches
// the span for an exporter that drops it.
//
//	go test -run '^$' -bench TracingMiddleware -benchmem ./services/
func BenchmarkTracingMiddleware(b *testing.B) {
	in := []byte(`{"task":{"id":"t1","type":"css_fix","subject":"src/app.css","payload":{"issue":"button misaligned by 3px on the settings page"},"submitted_at":"2026-05-18T14:22:00Z"},"run":{"pass":2,"attempt":2,"rung":"REFINE","step":"execute"},"at":"2026-05-18T14:22:00Z","by":"prompt@host:1"}`)
	out, err := services.Next(events.Base{Task: events.Task{ID: "t1"}, Run: events.Run{Pass: 2}}, "executed", "executed.v1",
		map[string]any{"result": map[string]any{"outcome": "success", "tokens_in": 812, "tokens_out": 164, "summary": "fixed the selector"}})
	if err != nil {
		b.Fatal(err)
	}
	handler := func(ctx context.Context, m *services.Msg) ([]services.Out, error) { return []services.Out{out}, nil }
	header := nats.Header{"traceparent": {"00-" + inTrace + "-" + inSpan + "-01"}, events.HeaderTaskID: {"t1"}, events.HeaderPass: {"2"}}
	run := func(b *testing.B, tracer trace.Tracer) {
		h := services.Tracing(tracer, "executor")(handler)
		m := &services.Msg{Subject: "dispatch.task.t1.prompted", Data: in, Header: header, Delivered: 1}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h(ctx, m); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("off", func(b *testing.B) { run(b, nil) })
	b.Run("on", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		run(b, tp.Tracer("bench"))
	})
}
