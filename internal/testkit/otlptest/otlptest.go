// Package otlptest is an in-process OTLP/HTTP trace receiver: an
// httptest server that decodes the protobuf export requests an OTLP
// exporter posts to /v1/traces and keeps their spans for a test to read.
package otlptest

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, its ids in hex.
type Span struct {
	TraceID, SpanID, ParentID string
	Name                      string
	// Kind is the span's kind: "internal", "server", "client",
	// "producer", "consumer" (or "unspecified").
	Kind       string
	Start, End time.Time
	// Attrs are the span's attributes, each value as text.
	Attrs map[string]string
	// Service is the resource's service.name.
	Service string
	// Error is the status message of a span whose status is Error; Failed
	// says it is.
	Error  string
	Failed bool
	// Events are the names of the span's events (an "exception" per
	// recorded error).
	Events []string
}

// Receiver collects the spans exported to it.
type Receiver struct {
	*httptest.Server
	mu       sync.Mutex
	spans    []Span
	requests int
	bad      []string
}

// New starts a receiver, closed at the end of the test.
func New(t testing.TB) *Receiver {
	r := &Receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.Close)
	return r
}

// Endpoint is the base URL for OTEL_EXPORTER_OTLP_ENDPOINT (the exporter
// adds /v1/traces).
func (r *Receiver) Endpoint() string { return r.URL }

// Spans returns every span received so far, oldest start first.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.spans)
	slices.SortStableFunc(out, func(a, b Span) int { return a.Start.Compare(b.Start) })
	return out
}

// Requests counts the export requests received, and Bad lists why each
// one refused was refused.
func (r *Receiver) Requests() (n int, bad []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, slices.Clone(r.bad)
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	req.Body = http.MaxBytesReader(w, req.Body, 64<<20)
	spans, err := Decode(req)
	r.mu.Lock()
	r.requests++
	if err != nil {
		r.bad = append(r.bad, err.Error())
	}
	r.spans = append(r.spans, spans...)
	r.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	body, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(body)
}

// Decode reads one OTLP/HTTP protobuf export request (gzip or not).
func Decode(req *http.Request) ([]Span, error) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		return nil, &Error{"want POST /v1/traces, got " + req.Method + " " + req.URL.Path}
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		return nil, &Error{"want Content-Type application/x-protobuf, got " + strconv.Quote(ct)}
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			return nil, err
		}
		body = zr
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	return DecodeExport(data)
}

// DecodeExport reads the protobuf bytes of an ExportTraceServiceRequest.
func DecodeExport(data []byte) ([]Span, error) {
	var ex collectorpb.ExportTraceServiceRequest
	if err := proto.Unmarshal(data, &ex); err != nil {
		return nil, err
	}
	var out []Span
	for _, rs := range ex.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					Name: s.GetName(), Kind: strings.ToLower(strings.TrimPrefix(s.GetKind().String(), "SPAN_KIND_")), Service: service, Attrs: attrs(s.GetAttributes()),
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Failed: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR, Error: s.GetStatus().GetMessage(),
				}
				if p := s.GetParentSpanId(); len(p) > 0 && !bytes.Equal(p, make([]byte, len(p))) {
					sp.ParentID = hex.EncodeToString(p)
				}
				for _, ev := range s.GetEvents() {
					sp.Events = append(sp.Events, ev.GetName())
				}
				out = append(out, sp)
			}
		}
	}
	return out, nil
}

// attrs is kvs as text.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

// Error is a request the receiver refuses.
type Error struct{ Reason string }

func (e *Error) Error() string { return "otlptest: " + e.Reason }
