package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/webhook"
)

var quiet = slog.New(slog.DiscardHandler)

var secret = []byte("0123456789abcdef-test-secret")

// receiver records what it is sent, failing the first fails[id] tries of
// each delivery id (-1: every try).
type receiver struct {
	t     *testing.T
	mu    sync.Mutex
	fails map[string]int
	tries map[string]int // by delivery id
	got   map[string][]byte
	bad   int // tries whose signature did not verify
	// retryAfter, when set, is the Retry-After of a failed try.
	retryAfter string
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get(events.WebhookDeliveryHeader)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if events.VerifyWebhook(secret, r.Header.Get(events.WebhookSignatureHeader), r.Header.Get(events.WebhookDeliveryHeader), body, time.Now(), 0) != nil {
		rc.bad++
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	rc.tries[id]++
	if f := rc.fails[r.Header.Get(events.WebhookTaskHeader)]; f < 0 || rc.tries[id] <= f {
		if rc.retryAfter != "" {
			w.Header().Set("Retry-After", rc.retryAfter)
		}
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	rc.got[id] = body
}

func (rc *receiver) delivered() map[string][]byte {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[string][]byte{}
	for k, v := range rc.got {
		out[k] = v
	}
	return out
}

type env struct {
	t     *testing.T
	js    jetstream.JetStream
	tasks *services.TaskStore
	rc    *receiver
	url   string
	cfg   webhook.Config
}

func start(t *testing.T, cfg webhook.Config, fails map[string]int, pol ...func(url string) *policy.Source) *env {
	t.Helper()
	srv := natstest.Start(t)
	stores, err := services.Provision(t.Context(), srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{t: t, fails: fails, tries: map[string]int{}, got: map[string][]byte{}}
	hs := httptest.NewServer(rc)
	t.Cleanup(hs.Close)
	cfg.JS, cfg.Secret, cfg.Log = srv.JS, secret, quiet
	if len(pol) > 0 {
		cfg.Policy = pol[0](hs.URL + "/hook")
	}
	cfg.BackoffBase, cfg.BackoffMax = 20*time.Millisecond, 100*time.Millisecond
	e := &env{t: t, js: srv.JS, tasks: services.NewTaskStore(stores.Tasks), rc: rc, url: hs.URL + "/hook", cfg: cfg}
	e.run()
	return e
}

// run starts the service, once its consumers exist, until stop (or the
// test's end).
func (e *env) run() (stop func()) {
	e.t.Helper()
	s, err := webhook.New(e.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, spec := range []services.Spec{s.SettleSpec(), s.Spec()} {
		r := &services.Router{JS: e.js, Instance: "webhook@test", Log: quiet, Grace: time.Second}
		wg.Go(func() {
			if err := r.Run(ctx, spec); err != nil {
				e.t.Error(err)
			}
		})
	}
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	e.t.Cleanup(stop)
	waitFor(e.t, "the consumers", func() bool {
		_, err1 := e.js.Consumer(e.t.Context(), "KV_"+services.BucketTasks, webhook.ConsumerSettle)
		_, err2 := e.js.Consumer(e.t.Context(), services.Stream, webhook.ConsumerDeliver)
		return err1 == nil && err2 == nil
	})
	return stop
}

// drained waits until both consumers handled everything stored.
func (e *env) drained() {
	e.t.Helper()
	waitFor(e.t, "every settlement handled, nothing more due", func() bool {
		settle, err1 := e.js.Consumer(e.t.Context(), "KV_"+services.BucketTasks, webhook.ConsumerSettle)
		deliver, err2 := e.js.Consumer(e.t.Context(), services.Stream, webhook.ConsumerDeliver)
		if err1 != nil || err2 != nil {
			return false
		}
		si, err1 := settle.Info(e.t.Context())
		di, err2 := deliver.Info(e.t.Context())
		return err1 == nil && err2 == nil && si.NumPending == 0 && si.NumAckPending == 0 && di.NumPending == 0 && di.NumAckPending == 0
	})
}

// settle stores a settled state of task id calling back url.
func (e *env) settle(t *testing.T, id, url string) events.TaskState {
	t.Helper()
	st := events.TaskState{ID: id, Type: "css_fix", Subject: "a.css", Status: events.StatusFailed, Pass: 1,
		Reason: "out of tries", CallbackURL: url, SubmitSeq: 1, UpdatedAt: time.Now().UTC()}
	if _, _, err := e.tasks.Create(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	return st
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDeliversSignedAnswerAfterFailures(t *testing.T) {
	e := start(t, webhook.Config{AllowHosts: webhook.Hosts{"127.0.0.1"}, AllowPrivate: true, MaxAttempts: 5},
		map[string]int{"t1": 2})
	// A task still running is not settled: nothing is sent for it.
	running := events.TaskState{ID: "t0", Type: "css_fix", Subject: "a.css", Status: events.StatusRunning, CallbackURL: e.url}
	if _, _, err := e.tasks.Create(t.Context(), running); err != nil {
		t.Fatal(err)
	}
	st := e.settle(t, "t1", e.url)
	id := events.WebhookDeliveryID(st)
	waitFor(t, "the delivery", func() bool { return e.rc.delivered()[id] != nil })
	got := e.rc.delivered()
	if len(got) != 1 {
		t.Fatalf("delivered %d, want only t1's", len(got))
	}
	var answer events.WaitReply
	if err := json.Unmarshal(got[id], &answer); err != nil || answer.ID != "t1" || answer.Status != events.StatusFailed || !answer.Terminal || answer.Reason != "out of tries" {
		t.Errorf("answer %+v (%v), want t1's wait answer", answer, err)
	}
	if e.rc.tries[id] != 3 || e.rc.bad != 0 {
		t.Errorf("%d tries, %d bad signatures; want 3 and 0", e.rc.tries[id], e.rc.bad)
	}
	waitFor(t, "the delivered record", func() bool {
		_, err := streamLast(t, e.js, events.WebhookDeliveredSubject("t1"))
		return err == nil
	})
	// Its two failed tries were recorded; delivered since, it is not failing.
	last, err := streamLast(t, e.js, events.WebhookTrySubject("t1"))
	var try events.WebhookTry
	if err != nil || json.Unmarshal(last.Data, &try) != nil || try.Attempt != 2 || try.Code != 503 || try.DeliveryID != id || !try.NextAt.After(try.At) {
		t.Errorf("last try record %+v (%v), want try 2, a 503, a next try", try, err)
	}
	if f, err := webhook.ListFailing(t.Context(), e.js); err != nil || len(f) != 0 {
		t.Errorf("failing after the delivery: %+v (%v), want none", f, err)
	}
}

// A task without a callback URL of its own is delivered to its type's
// (the policy's), one of another type to none.
func TestPolicyCallbackURL(t *testing.T) {
	cfg := webhook.Config{AllowHosts: webhook.Hosts{"127.0.0.1"}, AllowPrivate: true}
	e := start(t, cfg, nil, func(url string) *policy.Source {
		return policy.Static(&policy.File{Types: map[string]policy.Type{"css_fix": {CallbackURL: url}}})
	})
	st := e.settle(t, "t5", "")
	other := st
	other.ID, other.Type = "t6", "docs"
	if _, _, err := e.tasks.Create(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	id := events.WebhookDeliveryID(st)
	waitFor(t, "the delivery to the type's URL", func() bool { return e.rc.delivered()[id] != nil })
	e.drained()
	if got := e.rc.delivered(); len(got) != 1 {
		t.Errorf("%d deliveries, want t5's only", len(got))
	}
}

// A task that settles while the service is stopped is delivered once it
// runs again: its consumer is durable. One that settled before the service
// first ran is not (its consumer starts at the stream's end).
func TestSettledWhileStoppedIsDelivered(t *testing.T) {
	srv := natstest.Start(t)
	stores, err := services.Provision(t.Context(), srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{t: t, tries: map[string]int{}, got: map[string][]byte{}}
	hs := httptest.NewServer(rc)
	t.Cleanup(hs.Close)
	e := &env{t: t, js: srv.JS, tasks: services.NewTaskStore(stores.Tasks), rc: rc, url: hs.URL + "/hook",
		cfg: webhook.Config{JS: srv.JS, Secret: secret, Log: quiet, AllowHosts: webhook.Hosts{"127.0.0.1"}, AllowPrivate: true}}
	before := e.settle(t, "before", e.url)
	stop := e.run()
	stop()
	during := e.settle(t, "during", e.url)
	e.run()
	waitFor(t, "the task settled while stopped", func() bool { return e.rc.delivered()[events.WebhookDeliveryID(during)] != nil })
	e.drained()
	if e.rc.delivered()[events.WebhookDeliveryID(before)] != nil {
		t.Error("a task settled before the service first ran was called back")
	}
}

func TestGivesUpThenRedelivers(t *testing.T) {
	fails := map[string]int{"t2": -1}
	e := start(t, webhook.Config{AllowHosts: webhook.Hosts{"127.0.0.1"}, AllowPrivate: true, MaxAttempts: 3}, fails)
	st := e.settle(t, "t2", e.url)
	e.settle(t, "t3", "https://not-allowed.example/hook")
	var failing []webhook.Failing
	waitFor(t, "two deliveries given up", func() bool {
		var err error
		failing, err = givenUp(t, e.js)
		return err == nil && len(failing) == 2
	})
	byTask := map[string]webhook.Failing{}
	for _, f := range failing {
		byTask[f.Due.TaskID] = f
	}
	if f := byTask["t2"]; f.Attempts != 3 || f.Due.DeliveryID != events.WebhookDeliveryID(st) || f.LastError != "the receiver answered 503" {
		t.Errorf("t2: %+v, want 3 tries, its last 503", f)
	}
	if f := byTask["t3"]; f.Attempts != 1 {
		t.Errorf("t3 (host not allowed): %d tries, want 1: refused at once", f.Attempts)
	}
	// The receiver recovers: a redelivery goes through, under the same id.
	e.rc.mu.Lock()
	fails["t2"] = 0
	e.rc.mu.Unlock()
	if err := webhook.Redeliver(t.Context(), e.js, byTask["t2"]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the redelivery", func() bool { return e.rc.delivered()[events.WebhookDeliveryID(st)] != nil })
	waitFor(t, "t2 no longer failing", func() bool {
		f, err := webhook.ListFailing(t.Context(), e.js)
		return err == nil && len(f) == 1 && f[0].Due.TaskID == "t3" && f[0].State == webhook.StateGivenUp
	})
}

// A receiver's Retry-After sets the next try (here capped by BackoffMax,
// 100ms in these tests, above any backoff of the first tries); while it
// fails the delivery is listed as retrying.
func TestReceiverRetryAfter(t *testing.T) {
	e := start(t, webhook.Config{AllowHosts: webhook.Hosts{"127.0.0.1"}, AllowPrivate: true}, map[string]int{"t7": -1})
	e.rc.mu.Lock()
	e.rc.retryAfter = "1"
	e.rc.mu.Unlock()
	st := e.settle(t, "t7", e.url)
	var f []webhook.Failing
	waitFor(t, "a retrying delivery", func() bool {
		var err error
		f, err = webhook.ListFailing(t.Context(), e.js)
		return err == nil && len(f) == 1
	})
	if r := f[0]; r.State != webhook.StateRetrying || r.Due.DeliveryID != events.WebhookDeliveryID(st) || r.NextAt.Sub(r.At) != 100*time.Millisecond ||
		r.LastError != "the receiver answered 503" {
		t.Errorf("%+v, want retrying, its next try Retry-After later (capped at 100ms)", r)
	}
	if err := webhook.Redeliver(t.Context(), e.js, f[0]); err == nil {
		t.Error("a retrying delivery was redelivered")
	}
}

// A host on the allow-list that resolves to a loopback address is refused
// when it is dialed: the check is on the address, not the URL's text.
func TestRefusesInternalAddressAtDial(t *testing.T) {
	e := start(t, webhook.Config{AllowHosts: webhook.Hosts{"localhost"}, MaxAttempts: 5}, nil)
	u, _ := url.Parse(e.url)
	e.settle(t, "t4", "http://localhost:"+u.Port()+"/hook")
	var failing []webhook.Failing
	waitFor(t, "the delivery given up", func() bool {
		var err error
		failing, err = givenUp(t, e.js)
		return err == nil && len(failing) == 1
	})
	if f := failing[0]; f.Attempts != 1 || !strings.Contains(f.LastError, "internal address") {
		t.Errorf("%+v, want refused at the first dial as internal", f)
	}
	if n := len(e.rc.delivered()); n != 0 || e.rc.tries[failing[0].Due.DeliveryID] != 0 {
		t.Errorf("the receiver was reached: %d deliveries", n)
	}
}

// A delivery whose last try was cut short (the service crashed or stopped
// during it) comes back once more — the consumer allows one delivery past
// the tries — and is given up with its review record, never sent again and
// never left to a max-deliveries advisory that `dispatch webhooks` would not
// list.
func TestLastTryCutShortIsGivenUp(t *testing.T) {
	cfg := webhook.Config{AllowHosts: webhook.Hosts{"127.0.0.1"}, AllowPrivate: true, MaxAttempts: 3,
		JS: natstest.Start(t).JS, Secret: secret, Log: quiet}
	s, err := webhook.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Spec().MaxDeliver; got != cfg.MaxAttempts+1 {
		t.Fatalf("MaxDeliver %d, want the tries and one more (%d)", got, cfg.MaxAttempts+1)
	}
	calls := 0
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls++ }))
	t.Cleanup(hs.Close)
	due := events.WebhookDue{DeliveryID: "whd_0123456789abcdef01234567", TaskID: "t1", URL: hs.URL + "/hook", Status: events.StatusSucceeded, Body: []byte(`{}`)}
	data, _ := json.Marshal(due)
	outs, err := s.Deliver(t.Context(), &services.Msg{Subject: events.WebhookDueSubject("t1"), Data: data, Delivered: cfg.MaxAttempts + 1, Seq: 7})
	if err != nil || len(outs) != 1 {
		t.Fatalf("%d outputs, %v; want the review record", len(outs), err)
	}
	if reason, id, ok := events.ParseReviewSubject(outs[0].Subject); !ok || reason != events.ReviewWebhook || id != "t1" {
		t.Fatalf("published on %s, want the webhook review record of t1", outs[0].Subject)
	}
	if calls != 0 {
		t.Fatalf("the receiver was called %d times past the last try", calls)
	}
}

// A delivery the receiver accepted stays delivered, even when the record
// of a try that overlapped it is stored after its delivered record.
func TestDeliveredStaysDeliveredInTheList(t *testing.T) {
	js := natstest.Start(t).JS
	if _, err := services.Provision(t.Context(), js, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	const id = "whd_0123456789abcdef01234567"
	at := time.Now().UTC()
	try := events.WebhookTry{DeliveryID: id, TaskID: "t1", URL: "https://hooks.example.com/x", Attempt: 1, Code: 500, Error: "the receiver answered 500", At: at}
	for i, rec := range []struct {
		subject, name string
		v             any
	}{
		{events.WebhookTrySubject("t1"), events.EventWebhookTry, try},
		{events.WebhookDeliveredSubject("t1"), events.EventWebhookDelivered, events.WebhookDelivered{DeliveryID: id, TaskID: "t1", URL: try.URL, Attempt: 2, Code: 204, At: at}},
		{events.WebhookTrySubject("t1"), events.EventWebhookTry, try}, // the overlapping try's record, stored last
	} {
		out, err := services.Emit(rec.subject, "rec-"+strconv.Itoa(i), rec.name, "t1", rec.v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(t.Context(), services.NatsMsg(out)); err != nil {
			t.Fatal(err)
		}
	}
	if failing, err := webhook.ListFailing(t.Context(), js); err != nil || len(failing) != 0 {
		t.Fatalf("failing %+v (%v), want none: the delivery was accepted", failing, err)
	}
}
