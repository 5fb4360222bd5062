package mesh_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/webhook"
)

// flakyReceiver is a webhook receiver that verifies every signature and
// fails a share of the tries it gets (answers 500 after reading them).
type flakyReceiver struct {
	secret []byte
	mu     sync.Mutex
	rnd    *rand.Rand
	fail   float64
	got    map[string]string // delivery id → task id, once accepted
	tries  int
	failed int
	bad    int // signatures that did not verify
	srv    *http.Server
	addr   string
}

func (f *flakyReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries++
	if err != nil || events.VerifyWebhook(f.secret, r.Header.Get(events.WebhookSignatureHeader), r.Header.Get(events.WebhookDeliveryHeader), body, time.Now(), 0) != nil {
		f.bad++
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var answer events.WaitReply
	if json.Unmarshal(body, &answer) != nil || answer.ID != r.Header.Get(events.WebhookTaskHeader) || !answer.Terminal {
		f.bad++
		http.Error(w, "not a settled task's wait answer", http.StatusBadRequest)
		return
	}
	if f.rnd.Float64() < f.fail {
		f.failed++
		http.Error(w, "flaky", http.StatusInternalServerError)
		return
	}
	f.got[r.Header.Get(events.WebhookDeliveryHeader)] = answer.ID
	w.WriteHeader(http.StatusNoContent)
}

// listen (re)starts the receiver on its address (a fresh one the first time).
func (f *flakyReceiver) listen(t *testing.T) {
	t.Helper()
	addr := f.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	proctest.WaitFor(t, 30*time.Second, "the receiver's port", func() (err error) { ln, err = net.Listen("tcp", addr); return err })
	f.addr = ln.Addr().String()
	f.srv = &http.Server{Handler: f, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = f.srv.Serve(ln) }()
}

func (f *flakyReceiver) stop() { _ = f.srv.Close() }

func (f *flakyReceiver) delivered() (tasks map[string]bool, ids, tries, failed, bad int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tasks = map[string]bool{}
	for _, task := range f.got {
		tasks[task] = true
	}
	return tasks, len(f.got), f.tries, f.failed, f.bad
}

// TestWebhookFaults: tasks with a callback URL run through the mesh; the
// webhook service runs as its own process (the dispatch binary), the
// receiver fails 30% of the tries and is restarted once mid-run, and the
// webhook process is SIGKILLed mid-run and started again. Every task's
// answer arrives, under its delivery id, signed, and none is given up.
// 1,000 tasks: the full size runs in seconds, so in the default run.
func TestWebhookFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the dispatch binary")
	}
	const n = 1000
	_, dispatch := proctest.Build(t)
	e := &env{t: t, srv: natstest.Start(t), pol: policy.Static(nil)}
	e.startWith(e.srv.NC, mesh.Options{AckWait: 2 * time.Second}) // the simulated model: every task succeeds

	secret := "fault-suite-secret-0123456789"
	rc := &flakyReceiver{secret: []byte(secret), rnd: rand.New(rand.NewPCG(28, 1)), fail: 0.3, got: map[string]string{}}
	rc.listen(t)
	t.Cleanup(rc.stop)
	env := proctest.Env("NATS_URL="+e.srv.URL(), "DISPATCH_WEBHOOK_SECRET="+secret,
		"DISPATCH_WEBHOOK_ALLOW_HOSTS=127.0.0.1", "DISPATCH_WEBHOOK_ALLOW_PRIVATE=true",
		"DISPATCH_WEBHOOK_BACKOFF=100ms", "DISPATCH_WEBHOOK_BACKOFF_MAX=2s", "DISPATCH_WEBHOOK_MAX_ATTEMPTS=60",
		"DISPATCH_WEBHOOK_TIMEOUT=2s", "DISPATCH_ACK_WAIT=4s", "DISPATCH_LOG_LEVEL=warn")
	hook := proctest.Start(t, "webhook", env, dispatch, "webhook")
	// Its consumer of the task states starts at their end when created:
	// the tasks are submitted once it exists.
	proctest.WaitFor(t, time.Minute, "the webhook service's consumers", func() error {
		if hook.Exited() {
			t.Fatalf("dispatch webhook exited:\n%s", hook.Output())
		}
		_, err := e.srv.JS.Consumer(context.Background(), "KV_"+services.BucketTasks, webhook.ConsumerSettle)
		return err
	})

	for i := range n {
		e.submit(events.Submit{ID: fmt.Sprintf("hook-%04d", i), Type: "css_fix", Subject: fmt.Sprintf("src/%d.css", i),
			CallbackURL: "http://" + rc.addr + "/hook"})
	}
	progress := func(atLeast int) func() error {
		return func() error {
			if _, ids, _, _, _ := rc.delivered(); ids < atLeast {
				return fmt.Errorf("%d of %d delivered", ids, atLeast)
			}
			return nil
		}
	}
	proctest.WaitFor(t, 3*time.Minute, "a third delivered", progress(n/3))
	if err := hook.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-hook.Done
	hook = proctest.Start(t, "webhook-2", env, dispatch, "webhook")
	proctest.WaitFor(t, 3*time.Minute, "half delivered", progress(n/2))
	rc.stop()
	time.Sleep(300 * time.Millisecond) // a few tries meet no receiver at all
	rc.listen(t)
	proctest.WaitFor(t, 5*time.Minute, "every task delivered", progress(n))

	tasks, ids, tries, failed, bad := rc.delivered()
	t.Logf("%d tasks: %d delivery ids received, %d tries reached the receiver, %d failed on purpose, %d accepted again (at least once), %d bad",
		n, ids, tries, failed, tries-failed-bad-ids, bad)
	if len(tasks) != n || ids != n || bad != 0 {
		t.Errorf("%d tasks and %d delivery ids received, %d bad signatures; want %d, %d, 0", len(tasks), ids, bad, n, n)
	}
	if failed == 0 {
		t.Error("the receiver failed no try: the retries were not exercised")
	}
	// The receiver sees a delivery just before the service records it: a
	// delivery with failed tries is listed as failing until then.
	proctest.WaitFor(t, time.Minute, "no delivery failing", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		failing, err := webhook.ListFailing(ctx, e.srv.JS)
		if err != nil {
			return err
		}
		for _, f := range failing {
			if f.State == webhook.StateGivenUp {
				t.Fatalf("delivery %s of %s given up: %s", f.Due.DeliveryID, f.Due.TaskID, f.LastError)
			}
		}
		if len(failing) != 0 {
			return fmt.Errorf("%d deliveries still listed as retrying", len(failing))
		}
		return nil
	})
}
