package deploy_test

// The deployment as it runs: nats-server built from the module and loaded
// with nats/single.conf and nats/users.conf, `dispatch provision` as admin,
// and every service as `dispatch <service>` under its own user, each a
// subprocess. Nothing here is a hand-written imitation of a service.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/intake"
	"github.com/dispatchmesh/dispatchmesh/services/webhook"
)

// verifiedType is the type with a verifier (a command that always answers
// "the problem exists") in the policy TestServicesRunAsTheirUsers seeds.
const verifiedType = "lint_fix"

// patience bounds every wait on the processes. It is a deadlock guard, not a
// timing assertion.
const patience = 45 * time.Second

// Every service runs as its own user from users.conf against a server
// loaded from single.conf; tasks submitted with `dispatch submit -wait` and
// through the submit API succeed end to end, and the status API answers. A
// user is refused what is not its own: the server's refusal reaches the
// error handler, and `dispatch` run under the wrong user exits naming it.
// webhookSecret signs the webhook deliveries of TestServicesRunAsTheirUsers.
const webhookSecret = "processes-test-webhook-secret"

func TestServicesRunAsTheirUsers(t *testing.T) {
	natsServer, dispatch := proctest.Build(t)
	pw := proctest.SetPasswords(t)
	srv := proctest.StartNATSTLS(t, natsServer, "nats", 0, "")
	url := srv.URL
	admin := connect(t, url, "admin", pw["admin"], "")
	proctest.WaitFor(t, patience, "JetStream", func() error { _, err := admin.js.AccountInfo(context.Background()); return err })

	as := func(user string) []string {
		return proctest.Env("DISPATCH_NATS_URL="+url, "DISPATCH_NATS_CA="+srv.CA, "DISPATCH_NATS_USER="+user, "DISPATCH_NATS_PASSWORD="+pw[user])
	}
	// The policy provision seeds: css_fix keeps the default, no verifier (a
	// pass goes from intake straight to the gate); verifiedType has a
	// command verifier, so the verifier too handles a task as its user.
	seed := filepath.Join(t.TempDir(), "seed-policy.json")
	if err := os.WriteFile(seed, []byte(`{"types": {"`+verifiedType+`": {"verifier": {"kind": "command", "command": ["true"]}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := proctest.RunToEnd(t, patience, "provision", append(as("admin"), "DISPATCH_POLICY_FILE="+seed), dispatch, "provision"); !strings.Contains(out, "provisioned:") || !strings.Contains(out, "seeded from "+seed) {
		t.Fatalf("dispatch provision said:\n%s", out)
	}

	receiver, hooks := webhookReceiver(t)

	// Each process serves /readyz on a metrics port of its own; the review
	// page and the webhook service run too, as the web and webhook users.
	running := map[string]*proctest.Process{}
	ports := proctest.FreePorts(t, len(mesh.All)+2)
	metrics := map[string]string{}
	for i, name := range append(slices.Clone(mesh.All), "web", mesh.Webhook) {
		metrics[name] = fmt.Sprintf("127.0.0.1:%d", ports[i])
		argv := []string{dispatch, name}
		env := append(as(name), "DISPATCH_METRICS_LISTEN="+metrics[name])
		switch name {
		case "web":
			argv = append(argv, "-listen", "127.0.0.1:0")
		case mesh.Webhook:
			env = append(env, "DISPATCH_WEBHOOK_SECRET="+webhookSecret, "DISPATCH_WEBHOOK_ALLOW_HOSTS=127.0.0.1", "DISPATCH_WEBHOOK_ALLOW_PRIVATE=true",
				"DISPATCH_WEBHOOK_BACKOFF=100ms")
		}
		running[name] = proctest.Start(t, name, env, argv...)
	}

	// The wrong user: gate may not read the history the prompt builder
	// needs, the verifier may not serve intake's API. Each exits at start
	// and says which permission is missing.
	wrong := []struct {
		name, user, service, want string
	}{
		{"prompt-as-gate", "gate", mesh.Prompt,
			`permission denied for $JS.API.STREAM.INFO.KV_dispatch_history: NATS user "gate" may not use bucket dispatch_history`},
		{"intake-as-verifier", "verifier", mesh.Intake, `NATS user "verifier" may not subscribe to it`},
	}
	var misfits []*proctest.Process
	for _, w := range wrong {
		misfits = append(misfits, proctest.Start(t, w.name, as(w.user), dispatch, w.service))
	}

	// The webhook service's consumer of the task states starts at their end
	// when created: e2e-api, which names a callback, settles after it exists.
	proctest.WaitFor(t, patience, "the webhook service's consumer", func() error {
		proctest.CheckRunning(t, running)
		_, err := admin.js.Consumer(context.Background(), "KV_"+services.BucketTasks, webhook.ConsumerSettle)
		return err
	})

	// Tasks, submitted as the client user: three of css_fix and one of
	// verifiedType with the CLI, one of css_fix through the micro API.
	var submits []*proctest.Process
	for i := range 3 {
		submits = append(submits, proctest.Start(t, fmt.Sprintf("submit-%d", i), as("client"), dispatch,
			"submit", "-id", fmt.Sprintf("e2e-%d", i), "-type", "css_fix", "-subject", fmt.Sprintf("src/app%d.css", i),
			"-payload", `{"issue":"button misaligned"}`, "-wait", "-timeout", patience.String()))
	}
	submits = append(submits, proctest.Start(t, "submit-verified", as("client"), dispatch,
		"submit", "-id", "e2e-verified", "-type", verifiedType, "-subject", "src/lint.go",
		"-payload", `{"issue":"unused variable"}`, "-wait", "-timeout", patience.String()))
	client := connect(t, url, "client", pw["client"], "_INBOX.client")
	var reply intake.SubmitReply
	proctest.WaitFor(t, patience, "the submit API", func() error {
		proctest.CheckRunning(t, running)
		msg, err := client.nc.Request(events.SubmitAPI, []byte(`{"id":"e2e-api","type":"css_fix","subject":"src/api.css","callback_url":"`+receiver.URL+`/hook"}`), 10*time.Second)
		if errors.Is(err, nats.ErrNoResponders) { // intake not subscribed yet
			return err
		}
		if err != nil {
			t.Fatalf("request %s: %v", events.SubmitAPI, err)
		}
		if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
			t.Fatalf("submit API answered %s %s", code, msg.Header.Get(micro.ErrorHeader))
		}
		return json.Unmarshal(msg.Data, &reply)
	})
	if reply.ID != "e2e-api" {
		t.Fatalf("submit API answered id %q", reply.ID)
	}

	for _, p := range submits {
		out := p.Wait(t, patience, running)
		if p.Err != nil || !strings.Contains(out, events.StageSucceeded) {
			t.Fatalf("%s: %v\n%s", p.Name, p.Err, out)
		}
		// -wait prints each stage: css_fix skipped the verifier (intake
		// published verified), verifiedType was queued and checked by it.
		want, not := "verdict=skipped verifier=none", "verdict=exists"
		if p.Name == "submit-verified" {
			want, not = "verdict=exists verifier=command", "verdict=skipped"
		}
		if !strings.Contains(out, want) || strings.Contains(out, not) {
			t.Fatalf("%s: no %q (or a %q) among its stages:\n%s", p.Name, want, not, out)
		}
	}
	proctest.WaitFor(t, patience, "e2e-api to succeed (status API)", func() error {
		proctest.CheckRunning(t, running)
		msg, err := client.nc.Request(intake.StatusAPI, []byte("e2e-api"), 10*time.Second)
		if err != nil {
			t.Fatalf("request %s: %v", intake.StatusAPI, err)
		}
		var st events.TaskState
		if err := json.Unmarshal(msg.Data, &st); err != nil {
			t.Fatalf("status API answered %q: %v", msg.Data, err)
		}
		if st.Status != events.StatusSucceeded {
			return fmt.Errorf("status %s", st.Status)
		}
		return nil
	})
	// The wait API, as the client: intake watches the task's state and
	// listens for its rejection with its own user's grants.
	msg, err := client.nc.Request(intake.WaitAPI, []byte(`{"id":"e2e-api","timeout":"5s"}`), 10*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", intake.WaitAPI, err)
	}
	var waited events.WaitReply
	if err := json.Unmarshal(msg.Data, &waited); err != nil || waited.Status != events.StatusSucceeded || waited.Result == nil {
		t.Fatalf("wait API answered %s: %v", msg.Data, err)
	}
	checkWebhook(t, admin, hooks, running[mesh.Webhook])
	if out := proctest.RunToEnd(t, patience, "status", as("client"), dispatch, "status", "e2e-0"); !strings.Contains(out, string(events.StatusSucceeded)) {
		t.Fatalf("dispatch status e2e-0:\n%s", out)
	}

	// The operator tools as the read-only auditor: a task's audit trail
	// and its status with every stage, read from the stream.
	if out := proctest.RunToEnd(t, patience, "audit-as-auditor", as("auditor"), dispatch, "audit", "e2e-0"); !strings.Contains(out, events.StageSucceeded) {
		t.Fatalf("dispatch audit e2e-0 as auditor:\n%s", out)
	}
	if out := proctest.RunToEnd(t, patience, "status-v-as-auditor", as("auditor"), dispatch, "status", "-v", "e2e-0"); !strings.Contains(out, events.StageSucceeded) {
		t.Fatalf("dispatch status -v e2e-0 as auditor:\n%s", out)
	}
	if out := proctest.RunToEnd(t, patience, "audit-webhook-as-auditor", as("auditor"), dispatch, "audit", "e2e-api"); !strings.Contains(out, "webhook.try") || !strings.Contains(out, "webhook.delivered") {
		t.Fatalf("dispatch audit e2e-api as auditor shows no webhook try and delivery:\n%s", out)
	}
	// The task explorer as the auditor and the web users: intake filed
	// every task in the index (as its own user), both may read it.
	for _, user := range []string{"auditor", "web"} {
		out := proctest.RunToEnd(t, patience, "tasks-as-"+user, as(user), dispatch, "tasks", "-type", "css_fix")
		for _, id := range []string{"e2e-0", "e2e-1", "e2e-2", "e2e-api"} {
			if !strings.Contains(out, id) {
				t.Fatalf("dispatch tasks as %s does not list %s:\n%s", user, id, out)
			}
		}
	}
	// The review client as the web user: a task's trust, as the gate sees
	// it, from the outcomes the recorder published (followed) and the
	// gate's facts (watched).
	var shown struct {
		Trust *struct {
			Outcomes int `json:"outcomes"`
		} `json:"trust"`
	}
	out := proctest.RunToEnd(t, patience, "review-show-as-web", as("web"), dispatch, "review", "show", "e2e-0", "-o", "json")
	doc := regexp.MustCompile(`(?ms)^\{$.*^\}$`).FindString(out) // the document, not the log lines
	if err := json.Unmarshal([]byte(doc), &shown); err != nil || shown.Trust == nil || shown.Trust.Outcomes == 0 {
		t.Fatalf("dispatch review show e2e-0 as web: no outcomes in its trust (%v):\n%s", err, out)
	}
	// A cancel, as the web user, of a task that ended: refused, nothing changed.
	p := proctest.Start(t, "cancel-as-web", as("web"), dispatch, "cancel", "e2e-0")
	if out := p.Wait(t, patience, running); p.Err == nil || !strings.Contains(out, "already ended") {
		t.Fatalf("dispatch cancel of a succeeded task: %v\n%s", p.Err, out)
	}

	for i, p := range misfits {
		out := p.Wait(t, patience, running)
		if p.Err == nil || !strings.Contains(out, wrong[i].want) || strings.Contains(out, "dispatch provision") {
			t.Errorf("%s exited with %v, want a failure naming %q:\n%s", p.Name, p.Err, wrong[i].want, out)
		}
	}

	// The policy: only admin may change it, and every service, watching
	// the bucket as its own user, applies a change at once — and refuses a
	// put that is not a policy, keeping the one in force.
	file := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(file, []byte(`{"types": {"css_fix": {"model": "gpt-4o", "max_retries": 4}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	denied := proctest.Start(t, "policy-set-as-gate", as("gate"), dispatch, "policy", "set", file)
	if out := denied.Wait(t, patience, running); denied.Err == nil ||
		!strings.Contains(out, `NATS user "gate" may not write to bucket `+services.BucketPolicy) {
		t.Fatalf("dispatch policy set as gate: %v\n%s", denied.Err, out)
	}
	out = proctest.RunToEnd(t, patience, "policy-set", as("admin"), dispatch, "policy", "set", file)
	var rev uint64
	if _, err := fmt.Sscanf(out[strings.Index(out, "policy revision "):], "policy revision %d in force", &rev); err != nil || rev == 0 {
		t.Fatalf("dispatch policy set as admin: %v\n%s", err, out)
	}
	policyKV, err := admin.js.KeyValue(context.Background(), services.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	badRev, err := policyKV.Put(context.Background(), "current", []byte(`{"types": {"css_fix": {"max_retries": "many"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range mesh.All {
		if name == mesh.Reaper {
			continue // decides nothing with the policy
		}
		applied := fmt.Sprintf(`msg="policy in force" bucket=%s key=current rev=%d`, services.BucketPolicy, rev)
		refused := fmt.Sprintf(`msg="policy change refused: the previous policy stays in force" bucket=%s key=current rev=%d in_force=%d`,
			services.BucketPolicy, badRev, rev)
		proctest.WaitFor(t, patience, name+" to apply revision "+fmt.Sprint(rev)+" and refuse "+fmt.Sprint(badRev), func() error {
			proctest.CheckRunning(t, running)
			out := running[name].Output()
			for _, want := range []string{applied, refused} {
				if !strings.Contains(out, want) {
					return fmt.Errorf("no %s", want)
				}
			}
			return nil
		})
	}

	// The gate's user, on a connection of its own: the refusals reach the
	// error handler. It follows the trust outcomes (and publishes the end
	// marker of a handoff) but may neither submit nor bind the history
	// bucket the prompt builder reads.
	gate := connect(t, url, "gate", pw["gate"], "_INBOX.gate")
	gate.denyPublish(t, events.SubmitSubject("x"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // how long the refused call waits
	defer cancel()
	if _, err := gate.js.KeyValue(ctx, services.BucketHistory); err == nil {
		t.Fatal("gate bound the history bucket")
	}
	gate.waitViolation(t, "Publish", "$JS.API.STREAM.INFO.KV_"+services.BucketHistory)
	gate.noViolations(t)

	// Every process is ready, and every service answers micro's discovery
	// ($SRV.PING, as `nats micro ls` sends it) with its stats, under its
	// own user's grants.
	for name, addr := range metrics {
		proctest.WaitFor(t, patience, name+" /readyz", func() error {
			proctest.CheckRunning(t, running)
			res, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				return err
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", res.Status, body)
			}
			return nil
		})
	}
	checkMicro(t, admin.nc, running)

	// Every service is still running on its own durable and was refused
	// nothing.
	proctest.CheckRunning(t, running)
	for _, name := range mesh.All {
		p := running[name]
		stream := services.StreamOf(name)
		if _, err := admin.js.Consumer(context.Background(), stream, name); err != nil {
			t.Errorf("consumer %s on %s: %v", name, stream, err)
		}
		if out := p.Output(); strings.Contains(strings.ToLower(out), "permission") {
			t.Errorf("%s was refused something:\n%s", name, out)
		}
	}
	for _, name := range []string{"web", mesh.Webhook} {
		if out := running[name].Output(); strings.Contains(strings.ToLower(out), "permission") {
			t.Errorf("%s was refused something:\n%s", name, out)
		}
	}
}

// webhookReceiver is a receiver of the webhook service's deliveries, which
// checks their signatures and fails the first try; hooks receives the task
// id of each delivery accepted.
func webhookReceiver(t *testing.T) (receiver *httptest.Server, hooks chan string) {
	hooks = make(chan string, 16)
	var tries atomic.Int32
	receiver = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if events.VerifyWebhook([]byte(webhookSecret), r.Header.Get(events.WebhookSignatureHeader), r.Header.Get(events.WebhookDeliveryHeader), body, time.Now(), 0) != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		if tries.Add(1) == 1 {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		hooks <- r.Header.Get(events.WebhookTaskHeader)
	}))
	t.Cleanup(receiver.Close)
	return receiver, hooks
}

// checkWebhook waits for the webhook service, as its own user, to deliver
// e2e-api's answer — on its second try: the first one failed, and was
// recorded (dispatch.webhook.try.*).
func checkWebhook(t *testing.T, admin *conn, hooks chan string, p *proctest.Process) {
	t.Helper()
	select {
	case id := <-hooks:
		if id != "e2e-api" {
			t.Fatalf("webhook delivered task %q, want e2e-api (the only one with a callback)", id)
		}
		stream, err := admin.js.Stream(context.Background(), services.Stream)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.GetLastMsgForSubject(context.Background(), events.WebhookTrySubject("e2e-api")); err != nil {
			t.Fatalf("the failed first try was not recorded: %v\n%s", err, p.Output())
		}
	case <-time.After(patience):
		t.Fatalf("no webhook delivery of e2e-api:\n%s", p.Output())
	}
}

// checkMicro asks $SRV.PING as nats micro ls does and wants an answer from
// dispatch (the API) and dispatch-<name> of every running process, then
// each one's $SRV.STATS: consuming (serving), ready, no errors, and for
// every stage but the reaper messages handled.
func checkMicro(t *testing.T, nc *nats.Conn, running map[string]*proctest.Process) {
	t.Helper()
	want := []string{services.MicroService}
	for name := range running {
		want = append(want, services.OpsName(name))
	}
	slices.Sort(want)
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.PING", inbox, nil); err != nil {
		t.Fatal(err)
	}
	var names []string
	for len(names) < len(want) {
		msg, err := sub.NextMsg(patience)
		if err != nil {
			t.Fatalf("$SRV.PING answered by %v, want %v: %v", names, want, err)
		}
		var p micro.Ping
		if err := json.Unmarshal(msg.Data, &p); err != nil {
			t.Fatalf("$SRV.PING answer %q: %v", msg.Data, err)
		}
		names = append(names, p.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Fatalf("$SRV.PING answered by %v, want %v", names, want)
	}
	for name := range running {
		msg, err := nc.Request("$SRV.STATS."+services.OpsName(name), nil, patience)
		if err != nil {
			t.Fatalf("$SRV.STATS.%s: %v", services.OpsName(name), err)
		}
		var stats micro.Stats
		var st services.OpsStatus
		if err := json.Unmarshal(msg.Data, &stats); err != nil || len(stats.Endpoints) != 1 {
			t.Fatalf("$SRV.STATS.%s answered %s (%v)", services.OpsName(name), msg.Data, err)
		}
		if err := json.Unmarshal(stats.Endpoints[0].Data, &st); err != nil {
			t.Fatalf("$SRV.STATS.%s data %s: %v", services.OpsName(name), stats.Endpoints[0].Data, err)
		}
		if !st.Running || !st.Ready || st.Errors != 0 || (name != mesh.Reaper && name != "web" && st.Handled == 0) {
			t.Errorf("%s: %+v", services.OpsName(name), st)
		}
	}
}
