// Package tracing exports the mesh's OpenTelemetry traces over OTLP/HTTP
// when the standard OTEL_EXPORTER_OTLP_* variables ask for it, and carries
// the W3C trace context (traceparent, tracestate) in NATS message headers.
//
// Off (no endpoint set), Setup returns a nil *Provider: the router then
// adds no middleware and no span is ever made, and Child returns its
// context's non-recording span without allocating.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Scope names the instrumentation: the tracer every span of the mesh
// comes from.
const Scope = "github.com/dispatchmesh/dispatchmesh"

// DefaultServiceName is the resource's service.name when
// OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) does
// not set one.
const DefaultServiceName = "dispatchmesh"

// Env variables read to decide whether traces are exported. The exporter
// and the SDK read the rest of the standard ones themselves
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE,
// OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_SERVICE_NAME, ...).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
)

// ErrProtocol is an OTLP protocol this build does not speak: only
// http/protobuf.
var ErrProtocol = errors.New("tracing: only the OTLP protocol http/protobuf is supported")

// Enabled reports whether getenv asks for traces: an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and
// neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none turns them
// off.
func Enabled(getenv func(string) string) bool {
	if getenv(EnvTracesEndpoint) == "" && getenv(EnvEndpoint) == "" {
		return false
	}
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return false
	}
	return !strings.EqualFold(strings.TrimSpace(getenv(EnvTracesExporter)), "none")
}

// Provider exports the spans of one process. A nil *Provider is tracing
// off: its Tracer is nil and its Shutdown does nothing.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// Setup returns the process's Provider, exporting over OTLP/HTTP as the
// OTEL_* variables of the environment say, or nil when they do not ask
// for traces (Enabled). Call Shutdown before exiting: it flushes the
// spans still batched.
func Setup(ctx context.Context) (*Provider, error) {
	return setup(ctx, os.Getenv)
}

func setup(ctx context.Context, getenv func(string) string) (*Provider, error) {
	if !Enabled(getenv) {
		return nil, nil
	}
	proto := getenv(EnvTracesProtocol)
	if proto == "" {
		proto = getenv(EnvProtocol)
	}
	if proto != "" && proto != "http/protobuf" {
		return nil, fmt.Errorf("%w, not %q", ErrProtocol, proto)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", DefaultServiceName)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil && res == nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return &Provider{tp: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))}, nil
}

// NewProvider is a Provider over an SDK tracer provider set up elsewhere
// (a test's, with its own exporter).
func NewProvider(tp *sdktrace.TracerProvider) *Provider { return &Provider{tp: tp} }

// Tracer is the mesh's tracer, nil when p is nil (tracing off).
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tp.Tracer(Scope)
}

// ForceFlush exports the spans still batched, and keeps exporting. It
// does nothing on a nil Provider.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.ForceFlush(ctx)
}

// Shutdown flushes the spans still batched and stops exporting. It does
// nothing on a nil Provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.Shutdown(ctx)
}

// w3c is the propagator of the trace context: W3C traceparent and
// tracestate, whatever the process's global propagator is.
var w3c propagation.TraceContext

// Extract returns ctx carrying the remote span context of h's
// traceparent and tracestate, when h has a valid one; else ctx.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return w3c.Extract(ctx, Header(h))
}

// ExtractHTTP is Extract from an HTTP request's headers (a gateway's).
func ExtractHTTP(ctx context.Context, h http.Header) context.Context {
	return w3c.Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject sets h's traceparent (and tracestate) to ctx's span context,
// when it has a valid one; else it leaves h alone.
func Inject(ctx context.Context, h nats.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	w3c.Inject(ctx, Header(h))
}

// Header carries a trace context in NATS headers. NATS header names are
// case-sensitive: it writes the lowercase names W3C gives and reads them
// in any case, so a client's Traceparent is found too.
type Header nats.Header

// Get returns the first value of key, matched in any case.
func (h Header) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set replaces every value of key, in any case, with value.
func (h Header) Set(key, value string) {
	for k := range h {
		if k != key && strings.EqualFold(k, key) {
			delete(h, k)
		}
	}
	h[key] = []string{value}
}

// Keys lists the header names.
func (h Header) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// Child starts a span named name under ctx's span, from the same tracer
// provider, when ctx's span is recording (a traced stage); else it returns
// ctx and its non-recording span, without allocating. Set its attributes
// only when span.IsRecording(), and End it with End.
func Child(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(Scope).Start(ctx, name, trace.WithSpanKind(kind))
}

// End records err on span (its status then Error) and ends it. A span not
// recording is left as it is.
func End(span trace.Span, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Recording is ctx's span when it is recording, else nil: a handler sets
// its attributes under `if s := tracing.Recording(ctx); s != nil`, so
// that tracing off builds none.
func Recording(ctx context.Context) trace.Span {
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		return s
	}
	return nil
}
