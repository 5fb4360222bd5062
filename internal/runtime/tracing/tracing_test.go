package tracing_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/otlptest"
)

const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestEnabled(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"nothing set", nil, false},
		{"endpoint", map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318"}, true},
		{"traces endpoint", map[string]string{tracing.EnvTracesEndpoint: "http://127.0.0.1:4318/v1/traces"}, true},
		{"sdk disabled", map[string]string{tracing.EnvEndpoint: "http://x", tracing.EnvSDKDisabled: "TRUE"}, false},
		{"exporter none", map[string]string{tracing.EnvEndpoint: "http://x", tracing.EnvTracesExporter: "none"}, false},
		{"exporter otlp", map[string]string{tracing.EnvEndpoint: "http://x", tracing.EnvTracesExporter: "otlp"}, true},
		{"only headers", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=b"}, false},
	} {
		if got := tracing.Enabled(env(c.env)); got != c.want {
			t.Errorf("%s: Enabled = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestSetupOffIsNil(t *testing.T) {
	t.Setenv(tracing.EnvEndpoint, "")
	t.Setenv(tracing.EnvTracesEndpoint, "")
	p, err := tracing.Setup(context.Background())
	if err != nil || p != nil {
		t.Fatalf("Setup = %v, %v; want nil, nil", p, err)
	}
	if p.Tracer() != nil {
		t.Error("a nil Provider has a tracer")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown of a nil Provider: %v", err)
	}
}

func TestSetupRefusesGRPC(t *testing.T) {
	t.Setenv(tracing.EnvEndpoint, "http://127.0.0.1:4317")
	t.Setenv(tracing.EnvProtocol, "grpc")
	if _, err := tracing.Setup(context.Background()); !errors.Is(err, tracing.ErrProtocol) {
		t.Fatalf("Setup with grpc: %v, want ErrProtocol", err)
	}
}

// Spans made under a Provider set up from the environment reach the
// endpoint it names once Shutdown flushes them: a stage's span, its child
// with an error, under the trace a traceparent header carried.
func TestSetupExportsAndContinuesTheTrace(t *testing.T) {
	rcv := otlptest.New(t)
	t.Setenv(tracing.EnvEndpoint, rcv.Endpoint())
	t.Setenv(tracing.EnvProtocol, "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "")
	p, err := tracing.Setup(context.Background())
	if err != nil || p == nil {
		t.Fatalf("Setup = %v, %v", p, err)
	}
	ctx := tracing.Extract(context.Background(), nats.Header{"Traceparent": {parent}})
	ctx, stage := p.Tracer().Start(ctx, "stage")
	if s := tracing.Recording(ctx); s == nil {
		t.Fatal("Recording: nil under a recording span")
	}
	cctx, call := tracing.Child(ctx, "call", trace.SpanKindClient)
	out := nats.Header{}
	tracing.Inject(cctx, out)
	tracing.End(call, errors.New("model down"))
	stage.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	spans := rcv.Spans()
	if len(spans) != 2 {
		t.Fatalf("received %d spans, want 2: %+v", len(spans), spans)
	}
	byName := map[string]otlptest.Span{}
	for _, s := range spans {
		byName[s.Name] = s
		if s.TraceID != "0af7651916cd43dd8448eb211c80319c" {
			t.Errorf("%s: trace %s, want the traceparent's", s.Name, s.TraceID)
		}
		if s.Service != tracing.DefaultServiceName {
			t.Errorf("%s: service.name %q, want %q", s.Name, s.Service, tracing.DefaultServiceName)
		}
	}
	if byName["stage"].ParentID != "b7ad6b7169203331" {
		t.Errorf("stage's parent %s, want the traceparent's span", byName["stage"].ParentID)
	}
	if c := byName["call"]; c.ParentID != byName["stage"].SpanID || !c.Failed || c.Error != "model down" {
		t.Errorf("call = %+v: want a failed child of the stage", c)
	}
	want := "00-0af7651916cd43dd8448eb211c80319c-" + byName["call"].SpanID + "-01"
	if got := out["traceparent"]; len(got) != 1 || got[0] != want {
		t.Errorf("injected traceparent %q, want [%s]", got, want)
	}
}

func TestHeaderAnyCase(t *testing.T) {
	h := tracing.Header{"TRACEPARENT": {parent}}
	if got := h.Get("traceparent"); got != parent {
		t.Errorf("Get in another case = %q", got)
	}
	h.Set("traceparent", "x")
	if len(h) != 1 || h["traceparent"][0] != "x" {
		t.Errorf("Set left %v, want the one lowercase name", h)
	}
	ctx := tracing.Extract(context.Background(), nats.Header{"traceparent": {parent}, "tracestate": {"vendor=1"}})
	out := nats.Header{}
	tracing.Inject(ctx, out)
	if out.Get("traceparent") != parent || out.Get("tracestate") != "vendor=1" {
		t.Errorf("a context passed through: %v", out)
	}
	hctx := tracing.ExtractHTTP(context.Background(), http.Header{"Traceparent": {parent}})
	if !trace.SpanContextFromContext(hctx).IsRemote() {
		t.Error("ExtractHTTP found no trace context")
	}
}

// Nothing is injected without a trace context, and nothing is made or
// allocated under a span that is not recording (tracing off).
func TestOffCostsNothing(t *testing.T) {
	h := nats.Header{}
	tracing.Inject(context.Background(), h)
	if len(h) != 0 {
		t.Errorf("Inject without a trace: %v", h)
	}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		cctx, span := tracing.Child(ctx, "call", trace.SpanKindClient)
		if span.IsRecording() || tracing.Recording(cctx) != nil {
			t.Fatal("a span recording with tracing off")
		}
		tracing.Inject(cctx, h)
		tracing.End(span, nil)
	})
	if allocs != 0 {
		t.Errorf("tracing off allocates %v per call", allocs)
	}
}

// FuzzExtract: any header a client sends is either ignored or carried on
// as a valid traceparent that reads back as the same span context.
func FuzzExtract(f *testing.F) {
	f.Add(parent, "vendor=1")
	f.Add("00-00000000000000000000000000000000-b7ad6b7169203331-01", "")
	f.Add("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a=b,c=d")
	f.Add("garbage", "=,=")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		ctx := tracing.Extract(context.Background(), nats.Header{"traceparent": {tp}, "tracestate": {ts}})
		out := nats.Header{}
		tracing.Inject(ctx, out)
		sc := trace.SpanContextFromContext(ctx)
		if !sc.IsValid() {
			if len(out) != 0 {
				t.Fatalf("invalid context injected %v", out)
			}
			return
		}
		again := trace.SpanContextFromContext(tracing.Extract(context.Background(), out))
		if again.TraceID() != sc.TraceID() || again.SpanID() != sc.SpanID() || again.TraceFlags() != sc.TraceFlags() {
			t.Fatalf("%q carried as %v reads back as %v", tp, out, again)
		}
	})
}
