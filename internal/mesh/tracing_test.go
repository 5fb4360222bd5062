package mesh_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/otlptest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/services/verifier"
)

// A submitter's trace: its span, as a traceparent sends it.
const (
	submitterTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	submitterSpan  = "00f067aa0ba902b7"
)

// tracedMesh starts every service exporting its spans, as `dispatch up`
// does, to an in-process OTLP receiver; flush stops the mesh and exports
// what is still batched.
func tracedMesh(t *testing.T, script openaitest.Script, pol *policy.File) (e *env, rcv *otlptest.Receiver, flush func()) {
	rcv = otlptest.New(t)
	t.Setenv(tracing.EnvEndpoint, rcv.Endpoint())
	t.Setenv(tracing.EnvTracesEndpoint, "")
	p, err := tracing.Setup(context.Background())
	if err != nil || p == nil {
		t.Fatalf("tracing.Setup = %v, %v", p, err)
	}
	e = newEnv(t, script, pol)
	nc, _ := e.srv.Connect(t)
	stop := e.startWith(nc, mesh.Options{
		Model:   executor.NewOpenAI(executor.OpenAIConfig{BaseURL: e.model.BaseURL(), APIKey: "test"}),
		AckWait: 2 * time.Second, Tracer: p.Tracer(),
	})
	return e, rcv, func() {
		stop()
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatalf("flush the spans: %v", err)
		}
		if _, bad := rcv.Requests(); len(bad) > 0 {
			t.Fatalf("the receiver refused exports: %v", bad)
		}
	}
}

// A task that fails once and succeeds on its retry is one trace: the
// submitter's (its traceparent on the submission), holding every stage of
// both passes in pipeline order, each a child of the stage that published
// its input, and a model call under each executor span, with the task's
// attributes and the failed attempt's outcome.
func TestOneTracePerTaskAcrossRetries(t *testing.T) {
	e, rcv, flush := tracedMesh(t, func(n int, _ openaitest.Request) openaitest.Reply {
		if n == 1 {
			return openaitest.Reply{Content: openaitest.Failure("widen the selector", "still broken"), TokensIn: 120, TokensOut: 30}
		}
		return openaitest.Reply{Content: openaitest.Success("fix the selector"), TokensIn: 100, TokensOut: 20}
	}, &policy.File{Types: map[string]policy.Type{
		"lint_fix": {Verifier: &policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"true"}}},
	}})
	msg := nats.NewMsg(events.SubmitSubject("lint_fix"))
	msg.Data = []byte(`{"id":"traced","type":"lint_fix","subject":"src/app.go"}`)
	msg.Header.Set("traceparent", "00-"+submitterTrace+"-"+submitterSpan+"-01")
	if _, err := e.srv.JS.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	if got := last(e.waitEnd("traced")).Stage; got != events.StageSucceeded {
		t.Fatalf("the task ended %s, want succeeded", got)
	}
	flush()

	var stages, calls []otlptest.Span
	byID := map[string]otlptest.Span{}
	for _, s := range rcv.Spans() {
		if s.TraceID != submitterTrace {
			continue
		}
		byID[s.SpanID] = s
		if s.Kind == "consumer" {
			stages = append(stages, s)
		} else {
			calls = append(calls, s)
		}
	}
	want := []string{
		"intake:1", "verifier:1", "gate:1", "prompt:1", "executor:1", "recorder:1",
		"verifier:2", "gate:2", "prompt:2", "executor:2", "recorder:2",
	}
	var got []string
	for _, s := range stages {
		got = append(got, s.Name+":"+s.Attrs[services.AttrPass])
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("stage spans of the trace, by start:\n got %v\nwant %v", got, want)
	}
	parent := submitterSpan
	for _, s := range stages {
		if s.ParentID != parent {
			t.Errorf("%s (pass %s): parent %s, want %s (the stage before)", s.Name, s.Attrs[services.AttrPass], s.ParentID, parent)
		}
		parent = s.SpanID
		if s.Attrs[services.AttrTaskID] != "traced" || s.Attrs[services.AttrTaskType] != "lint_fix" || s.Attrs[services.AttrFate] != "ack" {
			t.Errorf("%s: attributes %v", s.Name, s.Attrs)
		}
		if s.Name != services.ConsumerIntake && s.Attrs[services.AttrAttempt] != s.Attrs[services.AttrPass] {
			t.Errorf("%s: attempt %s on pass %s", s.Name, s.Attrs[services.AttrAttempt], s.Attrs[services.AttrPass])
		}
	}
	if a := stages[4].Attrs; a[services.AttrOutcome] != events.OutcomeFailure || a[services.AttrTokensIn] != "120" || a[services.AttrTokensOut] != "30" {
		t.Errorf("the failed attempt's executor span: %v", a)
	}
	if a := stages[5].Attrs; a[services.AttrNext] != events.StageRetry || a[services.AttrNextRung] != string(events.RungRefine) || a[services.AttrReason] == "" {
		t.Errorf("the first recorder span: %v, want a retry on REFINE and its reason", a)
	}
	if a := stages[7].Attrs; a[services.AttrCause] == "" || a[services.AttrNext] != events.StageAdmitted {
		t.Errorf("the retry's gate span: %v, want a decision cause and admitted", a)
	}
	if a := stages[10].Attrs; a[services.AttrNext] != events.StageSucceeded || a[services.AttrRung] == "" {
		t.Errorf("the last recorder span: %v", a)
	}

	var models, checks []string
	for _, c := range calls {
		p := byID[c.ParentID]
		switch c.Name {
		case executor.SpanModel:
			models = append(models, p.Name+":"+p.Attrs[services.AttrPass]+":"+c.Attrs[executor.AttrTokensIn])
		case verifier.SpanCheck:
			checks = append(checks, p.Name+":"+p.Attrs[services.AttrPass]+":"+c.Attrs[verifier.AttrVerdict])
		default:
			t.Errorf("unexpected span %s: %v", c.Name, c.Attrs)
		}
	}
	if strings.Join(models, " ") != "executor:1:120 executor:2:100" {
		t.Errorf("model calls (parent:pass:tokens in) %v, want one under each executor span", models)
	}
	if strings.Join(checks, " ") != "verifier:1:exists verifier:2:exists" {
		t.Errorf("verifier calls (parent:pass:verdict) %v, want one under each verifier span", checks)
	}
}

// A client that sends its span's traceparent with a submission through
// the request API (client.Submit) gets the task's spans in its trace.
func TestSubmittersTraceIsContinued(t *testing.T) {
	e, rcv, flush := tracedMesh(t, succeed, nil)
	c, err := client.New(e.srv.NC)
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex(submitterTrace)
	sid, _ := trace.SpanIDFromHex(submitterSpan)
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true,
	}))
	ctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	sub, err := c.Submit(ctx, client.Task{Type: "css_fix", Subject: "src/app.css"})
	if err != nil {
		t.Fatal(err)
	}
	if got := last(e.waitEnd(sub.ID)).Stage; got != events.StageSucceeded {
		t.Fatalf("the task ended %s", got)
	}
	flush()
	n := 0
	for _, s := range rcv.Spans() {
		if s.Attrs[services.AttrTaskID] != sub.ID || s.Kind != "consumer" {
			continue
		}
		n++
		if s.TraceID != submitterTrace {
			t.Errorf("%s: trace %s, want the submitter's %s", s.Name, s.TraceID, submitterTrace)
		}
		if s.Name == services.ConsumerIntake && s.ParentID != submitterSpan {
			t.Errorf("intake's span: parent %s, want the submitter's span %s", s.ParentID, submitterSpan)
		}
	}
	if n != 5 { // css_fix has no verifier: intake files it verified
		t.Errorf("%d stage spans of the task, want 5 (intake, gate, prompt, executor, recorder)", n)
	}
}
