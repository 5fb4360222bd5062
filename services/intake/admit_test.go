package intake

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
)

// The client of a reply subject: a connection for nats.go's requests, a
// process for per-request inboxes — read off inboxes nats.go itself makes.
func TestClientOf(t *testing.T) {
	srv := natstest.Start(t)
	other, _ := srv.Connect(t)
	prefixed, err := nats.Connect(srv.ClientURL(), nats.CustomInboxPrefix("_INBOX.client"))
	if err != nil {
		t.Fatal(err)
	}
	defer prefixed.Close()
	same := func(what, a, b string) {
		t.Helper()
		if ClientOf(a) != ClientOf(b) {
			t.Errorf("%s: %s and %s are two clients (%s, %s), want one", what, a, b, ClientOf(a), ClientOf(b))
		}
	}
	apart := func(what, a, b string) {
		t.Helper()
		if ClientOf(a) == ClientOf(b) {
			t.Errorf("%s: %s and %s are one client (%s), want two", what, a, b, ClientOf(a))
		}
	}
	same("one connection's requests", srv.NC.NewRespInbox(), srv.NC.NewRespInbox())
	apart("two connections' requests", srv.NC.NewRespInbox(), other.NewRespInbox())
	same("one process's per-request inboxes", nats.NewInbox(), other.NewInbox())
	same("one process's per-request inboxes, custom prefix", prefixed.NewInbox(), prefixed.NewInbox())
	apart("two inbox prefixes", nats.NewInbox(), prefixed.NewInbox())
	apart("requests and per-request inboxes", srv.NC.NewRespInbox(), srv.NC.NewInbox())
	apart("connections under one custom prefix", prefixed.NewRespInbox(), srv.NC.NewRespInbox())
	for reply, want := range map[string]string{
		"_INBOX.A1b2C3d4E5f6G7h8I9j0K1.abcdefgh":        "_INBOX.A1b2C3d4E5f6G7h8I9j0K1",
		"_INBOX.client.A1b2C3d4E5f6G7h8I9j0K1.abcdefgh": "_INBOX.client.A1b2C3d4E5f6G7h8I9j0K1",
		"_INBOX.A1b2C3d4E5f6G7h8I9j0K1":                 "_INBOX.A1b2C3d4E5f6",
		"_INBOX.client.A1b2C3d4E5f6G7h8I9j0K1":          "_INBOX.client.A1b2C3d4E5f6",
		"_INBOX.mine":                                   "_INBOX",
		"_INBOX.a-b-c-d-e-f-g-h-i-j-k-":                 "_INBOX", // 22 characters, not a NUID
	} {
		if got := ClientOf(reply); got != want {
			t.Errorf("ClientOf(%q) = %q, want %q", reply, got, want)
		}
	}
}

// stallJS is the mesh's JetStream with a PublishMsg (what Submit
// queues with) that waits for release
// (each call says so on entered first), or panics when panics is set.
type stallJS struct {
	jetstream.JetStream
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	panics  bool
}

// newStallJS wraps js. Defer open: a test that fails with a Publish
// stuck would otherwise wait in its cleanup's a.Stop for ever.
func newStallJS(js jetstream.JetStream) *stallJS {
	return &stallJS{JetStream: js, entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (s *stallJS) open() { s.once.Do(func() { close(s.release) }) }

func (s *stallJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if s.panics {
		panic("publish exploded")
	}
	s.entered <- struct{}{}
	<-s.release
	return s.JetStream.PublishMsg(ctx, msg, opts...)
}

// started is an API on srv with js, started; its service is stopped, then
// the API, at cleanup.
func started(t *testing.T, a *API, srv *natstest.Server) micro.Service {
	t.Helper()
	svc, err := a.Start(srv.NC, "0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop(); a.Stop() })
	// The server knows the API's subscriptions before any test asks: a
	// request from another connection sent earlier finds no responders.
	if err := srv.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return svc
}

// ask sends a request on nc and returns the answer.
func ask(t *testing.T, nc *nats.Conn, subject, body string) *nats.Msg {
	t.Helper()
	m, err := nc.Request(subject, []byte(body), 30*time.Second)
	if err != nil {
		t.Fatalf("%s %s: %v", subject, body, err)
	}
	return m
}

// asking sends a request on nc from a goroutine: its answer, or its error,
// arrives on the channel.
func asking(nc *nats.Conn, subject, body string) <-chan *nats.Msg {
	out := make(chan *nats.Msg, 1)
	go func() {
		m, err := nc.Request(subject, []byte(body), 2*time.Minute)
		if err != nil {
			m = nats.NewMsg("")
			m.Header.Set(micro.ErrorCodeHeader, "request failed")
			m.Header.Set(micro.ErrorHeader, err.Error())
		}
		out <- m
	}()
	return out
}

func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("no %s within a minute", what)
		panic("unreachable")
	}
}

// failed is the code and message of an error answer, "" for a success.
func failed(t *testing.T, m *nats.Msg) (code, message string) {
	t.Helper()
	code = m.Header.Get(micro.ErrorCodeHeader)
	if code == "" {
		return "", ""
	}
	var r events.ErrorReply
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Error == nil || fmt.Sprint(r.Error.Code) != code {
		t.Fatalf("error answer %s %q with body %q: want the same code in an api.error.v1 body", code, m.Header.Get(micro.ErrorHeader), m.Data)
	}
	return code, r.Error.Message
}

// While a submit is stuck on the server, the same instance serves another
// submit (the same endpoint: one micro subscription) and a status.
func TestAPIServesRequestsConcurrently(t *testing.T) {
	srv, _, a := newAPI(t)
	js := newStallJS(srv.JS)
	defer js.open()
	a.JS = js
	started(t, a, srv)
	nc, _ := srv.Connect(t)

	first := asking(nc, events.SubmitAPI, `{"id":"c1","type":"css_fix","subject":"a.css"}`)
	within(t, js.entered, "publish of the first submit")
	if code, msg := failed(t, ask(t, nc, StatusAPI, "nowhere")); code != "404" {
		t.Fatalf("status while a submit is stuck: %s %q, want 404", code, msg)
	}
	second := asking(nc, events.SubmitAPI, `{"id":"c2","type":"css_fix","subject":"b.css"}`)
	within(t, js.entered, "publish of the second submit")
	if n := a.Load()["submit"].InFlight; n != 2 {
		t.Fatalf("%d submits in flight, want 2", n)
	}
	js.open()
	for id, ch := range map[string]<-chan *nats.Msg{"c1": first, "c2": second} {
		m := within(t, ch, "answer of submit "+id)
		var r SubmitReply
		if code, msg := failed(t, m); code != "" || json.Unmarshal(m.Data, &r) != nil || r.ID != id {
			t.Fatalf("submit %s: %s %q %s", id, code, msg, m.Data)
		}
	}
	if n := a.Load()["submit"].InFlight; n != 0 {
		t.Fatalf("%d submits in flight once answered, want 0", n)
	}
}

// Past MaxRequests a request is answered 503 at once; Stop refuses new
// ones and returns only once the one in progress is answered.
func TestAPIRefusesPastItsLimitAndDrainsOnStop(t *testing.T) {
	srv, _, a := newAPI(t)
	js := newStallJS(srv.JS)
	defer js.open()
	a.JS, a.MaxRequests = js, 1
	started(t, a, srv)
	nc, _ := srv.Connect(t)

	first := asking(nc, events.SubmitAPI, `{"id":"d1","type":"css_fix","subject":"a.css"}`)
	within(t, js.entered, "publish of the submit")
	if code, msg := failed(t, ask(t, nc, StatusAPI, "d1")); code != "503" || !strings.Contains(msg, "1 requests in progress") {
		t.Fatalf("status past the limit: %s %q, want 503 naming the limit", code, msg)
	}

	stopped := make(chan struct{})
	go func() { a.Stop(); close(stopped) }()
	proctest.WaitFor(t, 30*time.Second, "Stop to refuse requests", func() error {
		if _, msg := failed(t, ask(t, nc, StatusAPI, "d1")); !strings.Contains(msg, "stopping") {
			return fmt.Errorf("status answered %q", msg)
		}
		return nil
	})
	select {
	case <-stopped:
		t.Fatal("Stop returned while a submit was in progress")
	default:
	}
	js.open()
	if code, msg := failed(t, within(t, first, "answer of the submit")); code != "" {
		t.Fatalf("the submit in progress at Stop: %s %q, want its answer", code, msg)
	}
	within(t, stopped, "Stop to return")
	load := a.Load()["status"]
	// A status asked while Stop has not yet taken effect is refused busy
	// too (the submit still holds the one place): one busy refusal or more.
	if load.Refused[RefusedBusy] < 1 || load.Refused[RefusedStopping] < 1 || load.Errors["503"] != load.Refused[RefusedBusy]+load.Refused[RefusedStopping] {
		t.Fatalf("status load %+v: want the busy refusals, the stopping ones, each a 503", load)
	}
}

// One client holding its MaxClientWaits is refused another wait; another
// client still gets one. The load shows in the service's STATS.
func TestAPIBoundsWaitsPerClient(t *testing.T) {
	ctx := context.Background()
	srv, stores, a := newAPI(t)
	a.MaxClientWaits = 2
	svc := started(t, a, srv)
	greedy, _ := srv.Connect(t)
	polite, _ := srv.Connect(t)

	held := []<-chan *nats.Msg{
		asking(greedy, WaitAPI, `{"id":"ghost-1","timeout":"10m"}`),
		asking(greedy, WaitAPI, `{"id":"ghost-2","timeout":"10m"}`),
	}
	proctest.WaitFor(t, 30*time.Second, "two waits held", func() error {
		if n := a.Load()["wait"].InFlight; n != 2 {
			return fmt.Errorf("%d held", n)
		}
		return nil
	})
	if code, msg := failed(t, ask(t, greedy, WaitAPI, `{"id":"ghost-3","timeout":"10m"}`)); code != "503" || !strings.Contains(msg, "2 waits and watches, the limit per client") {
		t.Fatalf("a third wait of one client: %s %q, want 503 naming the limit", code, msg)
	}

	data, err := json.Marshal(events.TaskState{ID: "done-1", Type: "css_fix", Subject: "a.css", Status: events.StatusSucceeded, Attempts: 1, Pass: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stores.Tasks.Put(ctx, "done-1", data); err != nil {
		t.Fatal(err)
	}
	m := ask(t, polite, WaitAPI, `{"id":"done-1","timeout":"10m"}`)
	var r events.WaitReply
	if code, msg := failed(t, m); code != "" || json.Unmarshal(m.Data, &r) != nil || r.Status != events.StatusSucceeded {
		t.Fatalf("another client's wait: %s %q %s, want the task's outcome", code, msg, m.Data)
	}

	var load EndpointLoad
	for _, e := range svc.Stats().Endpoints {
		if e.Name == "wait" {
			if err := json.Unmarshal(e.Data, &load); err != nil {
				t.Fatalf("wait STATS data %s: %v", e.Data, err)
			}
		}
	}
	if load.InFlight != 2 || load.Refused[RefusedClientWaits] != 1 || load.Refused[RefusedWaits] != 0 {
		t.Fatalf("wait STATS data %+v: want 2 in flight, one client refusal", load)
	}

	a.Stop()
	for i, ch := range held {
		if code, msg := failed(t, within(t, ch, "answer of a held wait")); code != "503" || !strings.Contains(msg, "stopping") {
			t.Errorf("held wait %d at Stop: %s %q, want 503 stopping", i, code, msg)
		}
	}
}

// A request whose handler panics is answered 500, and the API goes on.
func TestAPIAnswersAPanic(t *testing.T) {
	srv, _, a := newAPI(t)
	js := newStallJS(srv.JS)
	defer js.open()
	js.panics = true
	a.JS, a.Log = js, slog.New(slog.DiscardHandler)
	started(t, a, srv)
	if code, _ := failed(t, ask(t, srv.NC, events.SubmitAPI, `{"id":"p1","type":"css_fix","subject":"a.css"}`)); code != "500" {
		t.Fatalf("a submit that panicked: %q, want 500", code)
	}
	if code, msg := failed(t, ask(t, srv.NC, StatusAPI, "p1")); code != "404" {
		t.Fatalf("status after a panic: %s %q, want 404", code, msg)
	}
	if n := a.Load()["submit"].InFlight; n != 0 {
		t.Fatalf("%d submits in flight after the panic, want 0", n)
	}
}
