package mesh_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services/intake"
)

// The synchronous submit endpoint answers the task id or the validation
// error, keeps bad input for review, and makes one task of one id.
func TestSubmitAPI(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start()
	// The endpoint registers once the stores are open: wait until it answers pings.
	deadline := time.Now().Add(patience)
	for {
		if _, err := e.srv.NC.Request("$SRV.PING.dispatch", nil, time.Second); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("micro service never came up: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ask := func(body string) (intake.SubmitReply, string) {
		t.Helper()
		msg, err := e.srv.NC.Request(events.SubmitAPI, []byte(body), patience)
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
			return intake.SubmitReply{}, code + " " + msg.Header.Get(micro.ErrorHeader)
		}
		var r intake.SubmitReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			t.Fatalf("reply %q: %v", msg.Data, err)
		}
		return r, ""
	}

	r, problem := ask(`{"type":"css_fix","subject":"src/app.css"}`)
	if problem != "" || !events.ValidID(r.ID) || r.Duplicate {
		t.Fatalf("valid submit: %+v %s", r, problem)
	}
	if got := last(e.waitEnd(r.ID)).Stage; got != events.StageSucceeded {
		t.Fatalf("ended with %s", got)
	}
	if r2, _ := ask(`{"id":"` + r.ID + `","type":"css_fix","subject":"src/app.css"}`); r2.ID != r.ID || !r2.Duplicate {
		t.Fatalf("same id again: %+v", r2)
	}

	_, problem = ask(`{"type":"css_fix","subject":"a.css","max_retries":"lots"}`)
	if !strings.HasPrefix(problem, "400 ") || !strings.Contains(problem, "max_retries") {
		t.Fatalf("wrong-typed field answered %q", problem)
	}
	// The body says it too, as JSON: clients that do not read headers see it.
	if ae := e.askAPI(events.SubmitAPI, `{"type":"css_fix"}`).fails(t, events.CodeBadRequest); !slices.Equal(ae.Problems, []string{`"subject" is required`}) {
		t.Fatalf("missing subject answered %+v", ae)
	}
	_, problem = ask(`not json`)
	if !strings.HasPrefix(problem, "400 ") || !strings.Contains(problem, "malformed JSON") {
		t.Fatalf("malformed input answered %q", problem)
	}
	kept := e.waitReviews(events.ReviewRejected, 3)
	if !slices.ContainsFunc(kept, func(m *nats.Msg) bool { return string(m.Data) == "not json" }) {
		t.Fatal("rejected input not kept with its original bytes")
	}

	// status over request-reply, for clients in any language
	msg, err := e.srv.NC.Request(intake.StatusAPI, []byte(r.ID), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st events.TaskState
	if err := json.Unmarshal(msg.Data, &st); err != nil || st.Status != events.StatusSucceeded {
		t.Fatalf("status reply %s: %v", msg.Data, err)
	}
}

// The same id submitted again with the same body (normalised: white
// space, key order, fields left out as their zero) is a duplicate; with
// another body it is answered 409, naming what differs, and nothing is
// queued.
func TestSubmitAPIConflict(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start()
	first := `{"id":"conflict-1","type":"css_fix","subject":"src/app.css","payload":{"issue":"x","sizes":[1,2]},"metadata":{"team":"web","k":"v"}}`
	var r intake.SubmitReply
	e.askAPI(events.SubmitAPI, first).decodes(t, &r)
	if r.ID != "conflict-1" || r.Duplicate {
		t.Fatalf("first submit: %+v", r)
	}
	e.waitEnd(r.ID)
	same := `{ "metadata": {"k":"v","team":"web"}, "payload": {"sizes": [1, 2], "issue": "x"}, "max_retries": 0,
		"subject": "src/app.css", "type": "css_fix", "id": "conflict-1" }`
	e.askAPI(events.SubmitAPI, same).decodes(t, &r)
	if r.ID != "conflict-1" || !r.Duplicate {
		t.Fatalf("the same body again: %+v, want a duplicate", r)
	}
	other := `{"id":"conflict-1","type":"css_fix","subject":"src/b.css","payload":{"issue":"x","sizes":[1,3]},"metadata":{"team":"web","k":"v"},"max_retries":2}`
	ae := e.askAPI(events.SubmitAPI, other).fails(t, events.CodeConflict)
	want := []string{`"subject" differs: the task has "src/app.css", this submission "src/b.css"`, `"payload" differs at .sizes[1]`,
		`"max_retries" differs: the task has 0, this submission 2`}
	if !slices.Equal(ae.Problems, want) || !strings.Contains(ae.Message, "task conflict-1 exists and was submitted with another body") {
		t.Fatalf("another body answered %+v, want the problems %q", ae, want)
	}
	// Where to call back is part of the task.
	hooked := `{"id":"conflict-1","type":"css_fix","subject":"src/app.css","payload":{"issue":"x","sizes":[1,2]},"metadata":{"team":"web","k":"v"},"callback_url":"https://hooks.example.com/x"}`
	ae = e.askAPI(events.SubmitAPI, hooked).fails(t, events.CodeConflict)
	if want := []string{`"callback_url" differs: the task has "", this submission "https://hooks.example.com/x"`}; !slices.Equal(ae.Problems, want) {
		t.Fatalf("another callback answered %+v, want the problems %q", ae, want)
	}
}

// apiAnswer is one answer of the request-reply API.
type apiAnswer struct {
	data       []byte
	code, desc string // the micro error headers
}

// askAPI sends body to subject once the micro service answers pings.
func (e *env) askAPI(subject, body string) apiAnswer {
	e.t.Helper()
	deadline := time.Now().Add(patience)
	for {
		msg, err := e.srv.NC.Request(subject, []byte(body), patience)
		if err == nil {
			return apiAnswer{msg.Data, msg.Header.Get(micro.ErrorCodeHeader), msg.Header.Get(micro.ErrorHeader)}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("request %s: %v", subject, err)
		}
		time.Sleep(10 * time.Millisecond) // the service is not registered yet
	}
}

// fails checks the answer is an error with code, in the headers and as the
// JSON body, and returns it.
func (a apiAnswer) fails(t *testing.T, code int) *events.APIError {
	t.Helper()
	var r events.ErrorReply
	dec := json.NewDecoder(strings.NewReader(string(a.data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil || r.Error == nil {
		t.Fatalf("answer %s is not an error reply: %v", a.data, err)
	}
	if r.Error.Code != code || a.code != strconv.Itoa(code) || a.desc != r.Error.Message || r.Error.Problems == nil {
		t.Fatalf("answer %s (headers %s %q), want code %d in both", a.data, a.code, a.desc, code)
	}
	return r.Error
}

// decodes checks the answer is a success and decodes it into v.
func (a apiAnswer) decodes(t *testing.T, v any) {
	t.Helper()
	if a.code != "" || strings.Contains(string(a.data), `"error"`) {
		t.Fatalf("answer %s failed: %s %s", a.data, a.code, a.desc)
	}
	if err := json.Unmarshal(a.data, v); err != nil {
		t.Fatalf("answer %s: %v", a.data, err)
	}
}

// Status takes a bare id or {"id": …}; an id whose submission was rejected
// is answered with the rejection and its problems, an unknown one with 404.
func TestStatusAPI(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start()
	id := e.submit(events.Submit{ID: "st-1", Type: "css_fix", Subject: "src/app.css"})
	e.waitEnd(id)
	for _, body := range []string{id, id + "\n", `"` + id + `"`, `{"id":"` + id + `"}`} {
		var st events.TaskState
		e.askAPI(intake.StatusAPI, body).decodes(t, &st)
		if st.ID != id || st.Status != events.StatusSucceeded {
			t.Fatalf("status %q answered %+v", body, st)
		}
	}

	e.submitRaw("css_fix", []byte(`{"id":"st-bad","subject":"","max_retries":-1}`))
	e.waitReviews(events.ReviewRejected, 1)
	ae := e.askAPI(intake.StatusAPI, `{"id":"st-bad"}`).fails(t, events.CodeRejected)
	if !strings.Contains(ae.Message, "st-bad was rejected") ||
		!slices.Equal(ae.Problems, []string{`"subject" is required`, `"max_retries" must not be negative`}) {
		t.Fatalf("rejected id answered %+v", ae)
	}

	if ae := e.askAPI(intake.StatusAPI, "nobody").fails(t, events.CodeNotFound); ae.Message != "task nobody not found" {
		t.Fatalf("unknown id answered %+v", ae)
	}
	ae = e.askAPI(intake.StatusAPI, `{"id":"a.b"}`).fails(t, events.CodeBadRequest)
	if len(ae.Problems) != 1 || !strings.Contains(ae.Problems[0], `"id" "a.b"`) {
		t.Fatalf("invalid id answered %+v", ae)
	}
}

// Wait answers when the task is terminal, with the final answer; a wait
// that times out says where the task is, and waiting again gets the end.
func TestWaitAPI(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.model.Block = make(chan struct{}) // every model call waits for this
	e.start()
	e.submit(events.Submit{ID: "w-1", Type: "css_fix", Subject: "src/app.css"})
	select {
	case <-time.After(patience):
		t.Fatal("the model was never called")
	case <-func() chan struct{} {
		c := make(chan struct{})
		go func() {
			for e.model.Calls() == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			close(c)
		}()
		return c
	}():
	}
	var r events.WaitReply
	e.askAPI(intake.WaitAPI, `{"id":"w-1","timeout":"200ms"}`).decodes(t, &r)
	if !r.TimedOut || r.Terminal || r.Status != events.StatusRunning || r.Stage != events.StagePrompted || r.Result != nil {
		t.Fatalf("a wait on a task at the model answered %+v", r)
	}

	close(e.model.Block)
	r = events.WaitReply{}
	e.askAPI(intake.WaitAPI, "w-1").decodes(t, &r)
	if r.TimedOut || !r.Terminal || r.Status != events.StatusSucceeded || r.Attempts != 1 || r.TokensIn != 100 || r.Cost < 0 {
		t.Fatalf("wait answered %+v", r)
	}
	if r.Result == nil || r.Result.Outcome != events.OutcomeSuccess || r.Result.Approach != "fix the selector" || r.Result.Summary != "done" {
		t.Fatalf("wait answered the result %+v", r.Result)
	}
	// The recorder stores the state, then publishes the succeeded event.
	if r.Stage != events.StageSucceeded && r.Stage != events.StageExecuted {
		t.Fatalf("wait answered stage %q", r.Stage)
	}

	// Already terminal: answered at once, the same.
	var again events.WaitReply
	e.askAPI(intake.WaitAPI, `{"id":"w-1"}`).decodes(t, &again)
	if again.Status != events.StatusSucceeded || again.Result == nil || !reflect.DeepEqual(again.Result, r.Result) {
		t.Fatalf("second wait answered %+v", again)
	}

	if ae := e.askAPI(intake.WaitAPI, `{"id":"nobody","timeout":"100ms"}`).fails(t, events.CodeNotFound); !strings.Contains(ae.Message, "no task with this id appeared in 100ms") {
		t.Fatalf("unknown id answered %+v", ae)
	}
	e.askAPI(intake.WaitAPI, `{"id":"w-1","timeout":"1h"}`).fails(t, events.CodeBadRequest)
}

// A wait on a task whose submission is rejected answers the rejection:
// kept before the wait began, or arriving while it waits.
func TestWaitAPIRejected(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start()
	e.waitEnd(e.submit(events.Submit{ID: "ok-1", Type: "css_fix", Subject: "s"})) // every service is up
	e.submitRaw("css_fix", []byte(`{"id":"rej-1","type":"css_fix"}`))
	e.waitReviews(events.ReviewRejected, 1)
	ae := e.askAPI(intake.WaitAPI, "rej-1").fails(t, events.CodeRejected)
	if !slices.Equal(ae.Problems, []string{`"subject" is required`}) {
		t.Fatalf("stored rejection answered %+v", ae)
	}

	got := make(chan apiAnswer, 1)
	go func() { got <- e.askAPI(intake.WaitAPI, `{"id":"rej-2","timeout":"1m"}`) }()
	// Once the wait listens for the rejection, the bad task arrives.
	deadline := time.Now().Add(patience)
	for !e.listening(events.ReviewSubject(events.ReviewRejected, "rej-2")) {
		if time.Now().After(deadline) {
			t.Fatal("the wait never listened for rejections")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.submitRaw("css_fix", []byte(`{"id":"rej-2","subject":"s","max_retries":"lots"}`))
	select {
	case a := <-got:
		if ae := a.fails(t, events.CodeRejected); len(ae.Problems) != 1 || !strings.Contains(ae.Problems[0], "max_retries") {
			t.Fatalf("live rejection answered %+v", ae)
		}
	case <-time.After(patience):
		t.Fatal("the wait never answered the rejection")
	}
}

// A stopping mesh answers the waits in progress at once: 503, ask again.
func TestWaitAPIStop(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.model.Block = make(chan struct{})
	stop := e.start()
	e.submit(events.Submit{ID: "stop-1", Type: "css_fix", Subject: "s"})
	got := make(chan apiAnswer, 1)
	go func() { got <- e.askAPI(intake.WaitAPI, `{"id":"stop-1","timeout":"10m"}`) }()
	deadline := time.Now().Add(patience)
	for e.model.Calls() == 0 || !e.listening(events.ReviewSubject(events.ReviewRejected, "stop-1")) {
		if time.Now().After(deadline) {
			t.Fatal("the task never reached the model, or the wait never began")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case a := <-got:
		a.fails(t, events.CodeUnavailable)
	case <-time.After(patience):
		t.Fatal("the wait was not answered when the mesh stopped")
	}
	close(e.model.Block)
	<-stopped
}

// listening reports whether anyone subscribes to subject.
func (e *env) listening(subject string) bool {
	e.t.Helper()
	subs, err := e.srv.Subsz(&server.SubszOptions{Subscriptions: true, Test: subject})
	if err != nil {
		e.t.Fatal(err)
	}
	return subs.Total > 0
}
