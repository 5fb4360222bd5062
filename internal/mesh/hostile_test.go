package mesh_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/metricstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// Hostile input through the real mesh: every submission below is kept on
// dispatch.review.rejected — under its id when one can be read, else
// seq-N — with its original bytes and an error that says what is wrong,
// and nothing of it is left behind: no task state, no task event, no
// poison record. A valid task submitted among them runs to success.
func TestHostileInput(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start()
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	const seqKey = "seq-" // the key of input whose id cannot be read
	for _, c := range []struct {
		name    string
		subject string // default dispatch.submit.css_fix
		body    string
		key     string   // review key; seqKey: seq-<n> of the submission
		errs    []string // each in the record's Dispatch-Error
		cut     bool     // the record keeps the first services.MaxKeptBody bytes
	}{
		{
			name: "oversized", body: `{"id":"big-1","subject":"s","payload":"` + strings.Repeat("x", 600<<10) + `"}`,
			key: "big-1", errs: []string{"message is 614", "limit is 262144"},
		},
		{
			// With its headers a whole copy would not fit a message: the
			// record keeps what fits, and the original's size and hash.
			name: "oversized to the payload limit", body: `{"id":"big-3","subject":"s","payload":"` + strings.Repeat("x", 1_040_000) + `"}`,
			key: "big-3", errs: []string{"limit is 262144"}, cut: true,
		},
		{
			name: "oversized, id last", body: `{"subject":"s","payload":"` + strings.Repeat("x", 300<<10) + `","id":"big-2"}`,
			key: "big-2", errs: []string{"limit is 262144"},
		},
		{
			name: "oversized, no id", body: `{"subject":"s","payload":"` + strings.Repeat("x", 300<<10) + `"}`,
			key: seqKey, errs: []string{"limit is 262144"},
		},
		{
			name: "nested 9,999 levels", body: `{"id":"deep-1","subject":"s","payload":` + deep(9999) + `}`,
			key: "deep-1", errs: []string{"nested deeper than 64 levels", "later stages could not decode it"},
		},
		{
			name: "nested one level too deep", body: `{"id":"deep-2","subject":"s","payload":{"a":` + deep(63) + `}}`,
			key: "deep-2", errs: []string{"nested deeper than 64 levels"},
		},
		{
			name: "invalid UTF-8 in id", body: "{\"id\":\"id-\xff\",\"subject\":\"s\"}",
			key: seqKey, errs: []string{`"id" is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in type", body: "{\"id\":\"utf-type\",\"type\":\"css\xc3\",\"subject\":\"s\"}",
			key: "utf-type", errs: []string{`"type" is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in subject", body: "{\"id\":\"utf-subj\",\"subject\":\"src/\xe2\x28\xa1.css\"}",
			key: "utf-subj", errs: []string{`"subject" is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in payload", body: "{\"id\":\"utf-pay\",\"subject\":\"s\",\"payload\":{\"x\":[\"\xf0\x28\x8c\x28\"]}}",
			key: "utf-pay", errs: []string{`"payload" holds a string that is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in a metadata value", body: "{\"id\":\"utf-meta\",\"subject\":\"s\",\"metadata\":{\"team\":\"w\xffb\"}}",
			key: "utf-meta", errs: []string{`"metadata" holds a string that is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in a metadata key", body: "{\"id\":\"utf-mkey\",\"subject\":\"s\",\"metadata\":{\"\xc0\xc1\":\"v\"}}",
			key: "utf-mkey", errs: []string{`"metadata" holds a string that is not valid UTF-8`},
		},
		{
			name: "unpaired surrogate escape in subject", body: `{"id":"utf-sur","subject":"a\udc00b"}`,
			key: "utf-sur", errs: []string{`"subject" is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in the subject's type token", subject: "dispatch.submit.css\xff",
			body: `{"id":"utf-token","subject":"s"}`,
			key:  "utf-token", errs: []string{`"type" "css\xff" must be`},
		},
		{
			name: "grows past the limit when re-encoded", body: `{"id":"lt-1","subject":"s","payload":"` + strings.Repeat("<", 200<<10) + `"}`,
			key: "lt-1", errs: []string{"as the mesh encodes it", "limit is 262144"},
		},
		{
			name: "metadata that grows past the limit", body: `{"id":"lt-2","subject":"s","metadata":{"k":"` + strings.Repeat("&", 100<<10) + `"}}`,
			key: "lt-2", errs: []string{"as the mesh encodes it"},
		},
		{
			name: "wildcard * as the subject's type", subject: "dispatch.submit.*", body: `{"id":"wild-1","type":"css_fix","subject":"s"}`,
			key: "wild-1", errs: []string{`does not match the subject's type "*"`},
		},
		{
			name: "wildcard > as the subject's type", subject: "dispatch.submit.>", body: `{"id":"wild-2","subject":"s"}`,
			key: "wild-2", errs: []string{`"type" ">" must be`},
		},
		{
			name: "dot tokens after the type", subject: "dispatch.submit.css_fix.extra", body: `{"id":"dots-1","type":"css_fix","subject":"s"}`,
			key: "dots-1", errs: []string{`does not match the subject's type "css_fix.extra"`},
		},
		{
			name: "dotted type on a dotted subject", subject: "dispatch.submit.css.fix", body: `{"id":"dots-2","type":"css.fix","subject":"s"}`,
			key: "dots-2", errs: []string{`"type" "css.fix" must be`},
		},
		{
			name: "wildcard in the id", body: `{"id":"*","subject":"s"}`,
			key: seqKey, errs: []string{`"id" "*" must be`},
		},
		{
			name: "dot and wildcard in the id", body: `{"id":"a.>","subject":"s"}`,
			key: seqKey, errs: []string{`"id" "a.>" must be`},
		},
		{
			name: "wildcard type in the body", body: `{"id":"wild-3","type":"*","subject":"s"}`,
			key: "wild-3", errs: []string{`"type" "*" must be`},
		},
		{
			name: "bare dispatch.submit", subject: events.SubmitRoot, body: `{"id":"bare-1","type":"css_fix","subject":"s"}`,
			key: "bare-1", errs: []string{`published on "dispatch.submit", which names no task type: publish on dispatch.submit.<type>`},
		},
		{
			name: "bare dispatch.submit, no id, no type", subject: events.SubmitRoot, body: `{"subject":"s"}`,
			key: seqKey, errs: []string{"names no task type", `"type" is required`},
		},
		{
			name: "not JSON at all", body: "\x00\xff\xfe garbage",
			key: seqKey, errs: []string{"malformed JSON"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			subject := c.subject
			if subject == "" {
				subject = events.SubmitSubject("css_fix")
			}
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			ack, err := e.srv.JS.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte(c.body)})
			if err != nil {
				t.Fatalf("publish on %q: %v", subject, err)
			}
			key := c.key
			if key == seqKey {
				key += strconv.FormatUint(ack.Sequence, 10)
			}
			rec := e.waitRecord(t, events.ReviewSubject(events.ReviewRejected, key), ack.Sequence)
			want := []byte(c.body)
			if c.cut {
				sum := sha256.Sum256(want)
				if rec.Header.Get(events.HeaderOrigSize) != strconv.Itoa(len(want)) || rec.Header.Get(events.HeaderOrigSHA256) != hex.EncodeToString(sum[:]) {
					t.Errorf("a cut record says size %q, SHA-256 %q", rec.Header.Get(events.HeaderOrigSize), rec.Header.Get(events.HeaderOrigSHA256))
				}
				want = want[:services.MaxKeptBody]
			}
			if !bytes.Equal(rec.Data, want) {
				t.Errorf("record keeps %d bytes, not the original's %d", len(rec.Data), len(want))
			}
			if got := rec.Header.Get(events.HeaderOrigSubj); got != subject {
				t.Errorf("Dispatch-Orig-Subject = %q, want %q", got, subject)
			}
			for _, want := range c.errs {
				if got := rec.Header.Get(events.HeaderError); !strings.Contains(got, want) {
					t.Errorf("Dispatch-Error %q does not say %q", got, want)
				}
			}
			if _, err := e.tasks.Get(ctx, c.key); err == nil {
				t.Errorf("a task %s was created", c.key)
			}
		})
	}

	// A subject with an empty token reaches no stream: the publisher is
	// told at once (a core NATS publish of it is dropped by the server).
	for _, subject := range []string{"dispatch.submit..css_fix", "dispatch.submit."} {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		if _, err := e.srv.JS.Publish(ctx, subject, []byte(`{"id":"empty-tok","subject":"s"}`)); err == nil {
			t.Errorf("publish on %q was stored", subject)
		}
		cancel()
	}

	// The mesh still works, and nothing of the hostile input is left: one
	// task state (the valid one), no task event of any other, no poison.
	ok := e.submit(events.Submit{ID: "ok-1", Type: "css_fix", Subject: "src/app.css", Payload: []byte(`{"issue":"<b> & </b>"}`)})
	if got := last(e.waitEnd(ok)).Stage; got != events.StageSucceeded {
		t.Fatalf("the valid task ended with %s", got)
	}
	if keys := e.taskKeys(); !slices.Equal(keys, []string{"ok-1"}) {
		t.Errorf("task states: %v, want only ok-1", keys)
	}
	for _, m := range e.streamed(events.TaskRoot + ".>") {
		if id, _, _ := events.ParseTaskSubject(m.Subject); id != "ok-1" {
			t.Errorf("task event %s", m.Subject)
		}
	}
	if p := e.reviews(events.ReviewPoison); len(p) > 0 {
		t.Errorf("%d poison records, first %s: %s", len(p), p[0].Subject, p[0].Header.Get(events.HeaderError))
	}
}

// The synchronous endpoint answers the same input with 400 and the same
// problems, and keeps it under its id.
func TestHostileInputThroughTheAPI(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start()
	e.waitMicro()
	for _, c := range []struct {
		body, key, err string
	}{
		{`{"id":"api-deep","type":"css_fix","subject":"s","payload":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`, "api-deep", "nested deeper than 64 levels"},
		{"{\"id\":\"api-utf\",\"type\":\"css_fix\",\"subject\":\"\xff\"}", "api-utf", `"subject" is not valid UTF-8`},
		{`{"id":"api-big","type":"css_fix","subject":"s","payload":"` + strings.Repeat("x", 600<<10) + `"}`, "api-big", "limit is 262144"},
		{`{"id":"api-lt","type":"css_fix","subject":"s","payload":"` + strings.Repeat(">", 100<<10) + `"}`, "api-lt", "as the mesh encodes it"},
	} {
		msg, err := e.srv.NC.Request(events.SubmitAPI, []byte(c.body), patience)
		if err != nil {
			t.Fatalf("%s: request: %v", c.key, err)
		}
		if code, text := msg.Header.Get(micro.ErrorCodeHeader), msg.Header.Get(micro.ErrorHeader); code != "400" || !strings.Contains(text, c.err) {
			t.Errorf("%s: answered %s %q, want 400 saying %q", c.key, code, text, c.err)
		}
		rec := e.waitRecord(t, events.ReviewSubject(events.ReviewRejected, c.key), 0)
		if !bytes.Equal(rec.Data, []byte(c.body)) || !strings.Contains(rec.Header.Get(events.HeaderError), c.err) {
			t.Errorf("%s: record %q", c.key, rec.Header.Get(events.HeaderError))
		}
	}
	if keys := e.taskKeys(); len(keys) != 0 {
		t.Errorf("task states: %v", keys)
	}
}

// waitRecord waits for the newest record on subject (of the submission at
// seq, when seq > 0) and returns it. It reads by subject, without a consumer.
func (e *env) waitRecord(t testing.TB, subject string, seq uint64) *nats.Msg {
	t.Helper()
	ctx := context.Background()
	stream, err := e.srv.JS.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(patience)
	for {
		m, err := stream.GetLastMsgForSubject(ctx, subject)
		switch {
		case err == nil && (seq == 0 || m.Header.Get(events.HeaderOrigSeq) == strconv.FormatUint(seq, 10)):
			return &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}
		case err != nil && !errors.Is(err, jetstream.ErrMsgNotFound):
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record on %s (of seq %d)", subject, seq)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// streamed reads every message stored on the filter.
func (e *env) streamed(filter string) []*nats.Msg {
	t := e.t
	t.Helper()
	ctx := context.Background()
	cons, err := e.srv.JS.OrderedConsumer(ctx, services.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*nats.Msg
	for uint64(len(out)) < info.NumPending {
		m, err := cons.Next(jetstream.FetchMaxWait(patience))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	}
	return out
}

// taskKeys lists the task states, sorted.
func (e *env) taskKeys() []string {
	e.t.Helper()
	ctx := context.Background()
	kv, err := e.srv.JS.KeyValue(ctx, services.BucketTasks)
	if err != nil {
		e.t.Fatal(err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	keys := []string{}
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// waitMicro waits until the submit endpoint answers pings.
func (e *env) waitMicro() {
	e.t.Helper()
	deadline := time.Now().Add(patience)
	for {
		if _, err := e.srv.NC.Request("$SRV.PING.dispatch", nil, time.Second); err == nil {
			return
		} else if time.Now().After(deadline) {
			e.t.Fatalf("micro service never came up: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A client that makes up task types. With KnownTypesOnly (as deploy/ runs
// intake), a type the policy does not name is rejected on both ways in —
// published on dispatch.submit.<type> and through the submit API — and
// kept on dispatch.review.rejected with the error, never run. Without it
// the made-up types run, and the metrics keep to the label limit: the
// named type and MaxTypeLabels others have labels of their own, every
// later type counts as type="other".
func TestHostileTypes(t *testing.T) {
	pol := &policy.File{Types: map[string]policy.Type{"css_fix": {}}}
	const problem = `is not a task type the policy names`
	t.Run("refused", func(t *testing.T) {
		e := newEnv(t, succeed, pol)
		nc, _ := e.srv.Connect(t)
		e.startWith(nc, mesh.Options{
			Model:          executor.NewOpenAI(executor.OpenAIConfig{BaseURL: e.model.BaseURL(), APIKey: "test"}),
			AckWait:        2 * time.Second,
			KnownTypesOnly: true,
		})
		e.submitRaw("made_up", []byte(`{"id":"mu-1","subject":"s"}`))
		rec := e.waitRecord(t, events.ReviewSubject(events.ReviewRejected, "mu-1"), 0)
		if got := rec.Header.Get(events.HeaderError); !strings.Contains(got, `"type" "made_up" `+problem) {
			t.Errorf("Dispatch-Error %q", got)
		}
		a := e.askAPI(events.SubmitAPI, `{"id":"mu-2","type":"made_up_too","subject":"s"}`)
		if ae := a.fails(t, events.CodeBadRequest); !strings.Contains(ae.Message, problem) {
			t.Errorf("API answered %q", ae.Message)
		}
		e.waitRecord(t, events.ReviewSubject(events.ReviewRejected, "mu-2"), 0)
		ok := e.submit(events.Submit{ID: "named-1", Type: "css_fix", Subject: "a.css"})
		if got := last(e.waitEnd(ok)).Stage; got != events.StageSucceeded {
			t.Fatalf("the named type's task ended with %s", got)
		}
		if keys := e.taskKeys(); !slices.Equal(keys, []string{"named-1"}) {
			t.Errorf("task states: %v, want only named-1", keys)
		}
	})
	t.Run("bounded", func(t *testing.T) {
		const maxTypes, made = 2, 6
		e := newEnv(t, succeed, pol)
		nc, _ := e.srv.Connect(t)
		reg := prometheus.NewPedanticRegistry()
		e.startWith(nc, mesh.Options{
			Model:         executor.NewOpenAI(executor.OpenAIConfig{BaseURL: e.model.BaseURL(), APIKey: "test"}),
			AckWait:       2 * time.Second,
			Registry:      reg,
			MaxTypeLabels: maxTypes,
		})
		ids := []string{e.submit(events.Submit{ID: "named-2", Type: "css_fix", Subject: "a.css"})}
		for i := range made {
			ids = append(ids, e.submit(events.Submit{ID: "made-" + strconv.Itoa(i), Type: "made_up_" + strconv.Itoa(i), Subject: "a.css"}))
		}
		for _, id := range ids {
			e.waitStatus(id, events.StatusSucceeded)
		}
		waitFor(t, "every task counted", func() bool {
			n := 0.0
			for _, v := range metricstest.Family(t, reg, "dispatch_tasks_finished_total") {
				n += v
			}
			return n == float64(len(ids))
		})
		for _, name := range []string{"dispatch_tasks_finished_total", "dispatch_attempts_total", "dispatch_executor_tokens_total", "dispatch_gate_decisions_total"} {
			types := map[string]float64{}
			for key, v := range metricstest.Family(t, reg, name) {
				for label := range strings.SplitSeq(key, ",") {
					if typ, ok := strings.CutPrefix(label, "type="); ok {
						types[typ] += v
					}
				}
			}
			if len(types) != 1+maxTypes+1 || types["css_fix"] == 0 || types[services.LabelOther] == 0 {
				t.Errorf("%s: types %v, want css_fix, %d made-up ones and other", name, types, maxTypes)
			}
		}
		if got := metricstest.Family(t, reg, "dispatch_tasks_finished_total")["by=recorder,status=succeeded,type=other"]; got != made-maxTypes {
			t.Errorf("dispatch_tasks_finished_total{type=other} = %v, want %d", got, made-maxTypes)
		}
	})
}
