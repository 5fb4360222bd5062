package deploy_test

// A hostile client against the deployment as shipped: nats-server from
// nats/single.conf and nats/users.conf (its monitoring port reachable, as
// an attacker inside the host or cluster network would have it), every
// service as `dispatch <service>` under its own user, all over TLS. The
// attacker holds the client user's password and tries each attack issues
// #20 and #22 name; each is refused or harmless, and the tasks it aimed at
// still end. Every limit of the account is read back and gone past.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

func TestHostileClient(t *testing.T) {
	natsServer, dispatch := proctest.Build(t)
	pw := proctest.SetPasswords(t)
	srv := proctest.StartNATSTLS(t, natsServer, "nats", 0, "")
	url := srv.URL
	admin := connect(t, url, "admin", pw["admin"], "")
	proctest.WaitFor(t, patience, "JetStream", func() error { _, err := admin.js.AccountInfo(context.Background()); return err })
	as := func(user string) []string {
		return proctest.Env("DISPATCH_NATS_URL="+url, "DISPATCH_NATS_CA="+srv.CA, "DISPATCH_NATS_USER="+user, "DISPATCH_NATS_PASSWORD="+pw[user])
	}
	if out := proctest.RunToEnd(t, patience, "provision", as("admin"), dispatch, "provision"); !strings.Contains(out, "provisioned:") {
		t.Fatalf("dispatch provision said:\n%s", out)
	}
	running := map[string]*proctest.Process{}
	for _, name := range mesh.All {
		running[name] = proctest.Start(t, name, as(name), dispatch, name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()

	attacker := connect(t, url, "client", pw["client"], "_INBOX.client")
	gc, err := client.New(attacker.nc)
	if err != nil {
		t.Fatal(err)
	}
	// Ready once the API answers.
	proctest.WaitFor(t, patience, "the API", func() error {
		proctest.CheckRunning(t, running)
		_, err := gc.Status(ctx, "nothing-yet")
		if err != nil && !strings.Contains(err.Error(), "not found") {
			return err
		}
		return nil
	})

	// The monitoring port names every service's inboxes, once each
	// service has started.
	var inboxes map[string][]string
	proctest.WaitFor(t, patience, "every service's inboxes on the monitoring port", func() error {
		proctest.CheckRunning(t, running)
		inboxes = serviceInboxes(t, srv.Monitor)
		for _, name := range mesh.All {
			if len(inboxes[name]) == 0 {
				return fmt.Errorf("none of %s yet", name)
			}
		}
		return nil
	})
	executorInbox := inboxes["executor"][0]

	// 1. A push consumer aimed at a service's inbox, a tool or a verifier
	// subject, on any stream: no consumer of any kind may be created.
	for _, stream := range []string{services.Stream, services.SubmitStream, "KV_" + services.BucketPolicy, services.OutcomeStream} {
		for _, deliver := range []string{executorInbox, "tool.exec", "verify.css_fix"} {
			body, _ := json.Marshal(map[string]any{"stream_name": stream, "config": map[string]any{
				"name": "pwn", "deliver_subject": deliver, "ack_policy": "none"}})
			attacker.denyPublishBody(t, "$JS.API.CONSUMER.CREATE."+stream+".pwn", body)
		}
	}
	// 1b. Fifty durable consumers (issue #22: the client once made 50 of
	// 50), through the current and the legacy API, on five streams: each
	// refused, and admin finds none.
	durableStreams := []string{services.Stream, services.SubmitStream, services.AdvisoryStream, services.OutcomeStream, "KV_" + services.BucketTasks}
	for i := range 50 {
		stream, name := durableStreams[i%len(durableStreams)], fmt.Sprintf("pwn-durable-%d", i)
		subject := "$JS.API.CONSUMER.CREATE." + stream + "." + name
		if i%2 == 1 {
			subject = "$JS.API.CONSUMER.DURABLE.CREATE." + stream + "." + name
		}
		body, _ := json.Marshal(map[string]any{"stream_name": stream, "config": map[string]any{
			"durable_name": name, "ack_policy": "explicit", "max_deliver": 1}})
		attacker.denyPublishBody(t, subject, body)
	}
	if n := countConsumers(ctx, t, admin, "pwn"); n != 0 {
		t.Fatalf("the client created %d consumers", n)
	}
	t.Logf("50 durable consumers as client: 50 refused (permissions violation), 0 created (admin lists every stream's consumers)")
	// 2. A forged policy update: the bucket is admin's alone.
	attacker.denyPublish(t, "$KV."+services.BucketPolicy+".current")
	// 3. Publishing as a service: a stage's event, a review decision.
	attacker.denyPublish(t, events.TaskSubject("victim-1", events.StageSucceeded))
	attacker.denyPublish(t, events.ReviewSubject(events.ReviewAction, "victim-1"))
	// 4. Reading another task's state or events directly.
	for _, s := range []string{
		"$JS.API.DIRECT.GET.KV_" + services.BucketTasks + ".$KV." + services.BucketTasks + ".victim-1",
		"$JS.API.STREAM.MSG.GET.KV_" + services.BucketTasks,
		"$JS.API.STREAM.MSG.GET." + services.Stream,
		"$JS.API.DIRECT.GET." + services.Stream + "." + events.TaskFilter("victim-1"),
		"$JS.API.STREAM.MSG.GET." + services.SubmitStream,
	} {
		attacker.denyPublish(t, s)
	}
	// 5. Any subject a stream captures, a submission included: the server
	// sends the PubAck of a captured publish to whatever reply the
	// publisher names, unchecked ($KV.dispatch_tasks.<id>, a stage event).
	attacker.denyPublish(t, events.SubmitSubject("css_fix"))
	attacker.noViolations(t)
	// 6. An API request whose reply is not an inbox: intake would answer
	// there with its own grants (task state, a queued event, a rejection,
	// another task's events on a stage subject). It is dropped.
	for _, r := range []struct{ api, reply, body string }{
		{events.APIStatus, "$KV." + services.BucketTasks + ".victim-9", `{"id":"victim-9"}`},
		{events.APIWatch, events.TaskSubject("victim-9", events.StageVerified), `{"id":"victim-1","timeout":"1s"}`},
		{events.SubmitAPI, events.ReviewSubject(events.ReviewRejected, "victim-9"), `{"type":"css_fix"}`},
	} {
		if err := attacker.nc.PublishRequest(r.api, r.reply, []byte(r.body)); err != nil {
			t.Fatal(err)
		}
	}
	proctest.WaitFor(t, patience, "intake to drop the three requests with a forged reply", func() error {
		if n := strings.Count(running[mesh.Intake].Output(), "reply subject outside _INBOX. dropped"); n < 3 {
			return fmt.Errorf("%d dropped", n)
		}
		return nil
	})
	tasksKV, err := admin.js.KeyValue(ctx, services.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := tasksKV.Get(ctx, "victim-9"); err == nil {
		t.Fatalf("a forged reply wrote task state: %s", e.Value())
	}

	// Every limit of the account is in force (deploy/README.md#limits):
	// the JetStream limits as admin and a service read them, the
	// connection limits by the client's floods.
	limits := readServerConf(t, filepath.Join("nats", "single.conf"), 1).account
	gate := connect(t, url, "gate", pw["gate"], "_INBOX.gate")
	for _, c := range []*conn{admin, gate} {
		t.Logf("account %s limits in force %s", services.Stream, limitsReport(c.user, checkLimitsInForce(ctx, t, c.js, c.user, limits)))
	}
	probeJetStreamLimits(ctx, t, admin.js, limits)
	floodSubscriptions(t, url, pw["client"], limits.MaxSubscriptions)
	floodConnections(t, srv, pw["client"], limits.MaxConnections)
	if got := int64(attacker.nc.MaxPayload()); got != limits.MaxPayload {
		t.Errorf("max_payload announced to the client: %d, want %d", got, limits.MaxPayload)
	}
	t.Logf("max_payload %d: announced to the client, whose library refuses a bigger publish", limits.MaxPayload)

	// 7. Insider squatting: web may publish submissions (a reviewer's
	// resubmit). It squats the ids a service or the API will publish under,
	// before the victims are submitted, with junk that also carries headers
	// naming another task and a service.
	web := connect(t, url, "web", pw["web"], "_INBOX.web")
	victimTask := client.Task{ID: "victim-2", Type: "css_fix", Subject: "src/victim2.css"}
	victimBody, err := json.Marshal(victimTask)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(victimBody)
	var squats []string
	for _, stage := range []string{"index", events.StageQueued, events.StageVerified, events.StageAdmitted, events.StagePrompted, events.StageExecuted, events.StageSucceeded} {
		squats = append(squats, events.MsgID("victim-1", 1, stage))
	}
	squats = append(squats, "submit:victim-2", "submit:victim-2:"+hex.EncodeToString(sum[:12]), "submit:victim-2:"+hex.EncodeToString(sum[:]))
	for _, id := range squats {
		m := nats.NewMsg(events.SubmitSubject("css_fix"))
		m.Data = []byte("junk, not a task")
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set(events.HeaderTaskID, "victim-1")
		m.Header.Set(events.HeaderService, "recorder@forged")
		ack, err := web.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatalf("squat %s: %v", id, err)
		}
		if ack.Stream != services.SubmitStream {
			t.Fatalf("a submission is stored on %s, want %s", ack.Stream, services.SubmitStream)
		}
	}

	// 8. Insider: web may create consumers on DISPATCH. It aims push
	// consumers at every inbox of every service, delivering a forged policy
	// that would run a command as the executor.
	marker := filepath.Join(t.TempDir(), "pwned")
	forged := fmt.Sprintf(`{"types": {"pwn_fix": {"executor": "command", "command": ["/bin/sh", "-c", "touch %s"]}}}`, marker)
	pwnSubject := events.ReviewSubject(events.ReviewAction, "pwn")
	var aimed []string
	for user, list := range inboxes {
		for i, inbox := range list {
			name := fmt.Sprintf("pwn-%s-%d", user, i)
			_, err := web.js.CreateOrUpdateConsumer(ctx, services.Stream, jetstream.ConsumerConfig{
				Name: name, DeliverSubject: inbox, FilterSubject: pwnSubject, AckPolicy: jetstream.AckNonePolicy,
			})
			if err != nil {
				t.Fatalf("web aims a consumer at %s: %v", inbox, err)
			}
			aimed = append(aimed, name)
		}
	}
	fm := nats.NewMsg(pwnSubject)
	fm.Data = []byte(forged)
	fm.Header.Set("KV-Operation", "PUT")
	if _, err := web.js.PublishMsg(ctx, fm); err != nil {
		t.Fatal(err)
	}
	for _, name := range aimed {
		proctest.WaitFor(t, patience, "the forged message delivered by "+name, func() error {
			// A push consumer: jetstream.Consumer binds pull consumers only.
			msg, err := admin.nc.Request("$JS.API.CONSUMER.INFO."+services.Stream+"."+name, nil, 5*time.Second)
			if err != nil {
				return err
			}
			var info jetstream.ConsumerInfo
			if err := json.Unmarshal(msg.Data, &info); err != nil {
				return err
			}
			if info.Delivered.Stream == 0 {
				return fmt.Errorf("not yet: %s", msg.Data)
			}
			return nil
		})
	}

	// The executor saw the forgery and said so (its policy watcher, or its
	// router, whichever inbox the message reached first).
	proctest.WaitFor(t, patience, "the executor to report the forged deliveries", func() error {
		out := running[mesh.Executor].Output()
		if strings.Contains(out, "forged delivery ignored") || strings.Contains(out, "delivered by another consumer ignored") {
			return nil
		}
		return fmt.Errorf("not yet")
	})

	// The victims, submitted after the squats: each still ends. victim-1
	// with `dispatch submit -wait` (its stages come through the watch API),
	// victim-2 through the submit API with the Go client (Watch, Wait).
	sub := proctest.Start(t, "submit-victim-1", as("client"), dispatch, "submit", "-id", "victim-1", "-type", "css_fix",
		"-subject", "src/victim1.css", "-wait", "-timeout", patience.String())
	submitted, err := gc.Submit(ctx, victimTask)
	if err != nil || submitted.ID != "victim-2" || submitted.Duplicate {
		t.Fatalf("submit victim-2 after its id was squatted: %+v, %v; want a new task", submitted, err)
	}
	var stages []string
	wctx, wcancel := context.WithTimeout(ctx, patience)
	err = gc.Watch(wctx, "victim-2", func(e client.Event) bool {
		stages = append(stages, e.Stage)
		final, _ := e.Final()
		return !final
	})
	wcancel()
	if err != nil || !slices.Contains(stages, events.StageSucceeded) {
		t.Fatalf("watch victim-2 as the client: %v, stages %v", err, stages)
	}
	out, err := gc.Wait(ctx, "victim-2")
	if err != nil || out.Status != events.StatusSucceeded {
		t.Fatalf("wait victim-2: %+v, %v", out, err)
	}
	if o := sub.Wait(t, patience, running); sub.Err != nil || !strings.Contains(o, events.StageSucceeded) {
		t.Fatalf("dispatch submit -wait victim-1 as the client: %v\n%s", sub.Err, o)
	}

	// The junk is kept as rejected submissions, saying nothing the client
	// claimed: no task id, no service.
	checkRejectedJunk(ctx, t, admin, len(squats))

	// The forged policy reached no service: admin's next policy set reaches
	// every one, and no service ever had a policy it did not come from.
	file := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(file, []byte(`{"types": {"css_fix": {"max_retries": 4}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	set := proctest.RunToEnd(t, patience, "policy-set", as("admin"), dispatch, "policy", "set", file)
	var rev uint64
	if _, err := fmt.Sscanf(set[strings.Index(set, "policy revision "):], "policy revision %d in force", &rev); err != nil || rev == 0 {
		t.Fatalf("dispatch policy set as admin: %v\n%s", err, set)
	}
	inForce := regexp.MustCompile(`msg="policy in force" bucket=` + services.BucketPolicy + ` key=current rev=(\d+)`)
	for _, name := range mesh.All {
		if name == mesh.Reaper {
			continue // decides nothing with the policy
		}
		proctest.WaitFor(t, patience, name+" to apply revision "+fmt.Sprint(rev), func() error {
			proctest.CheckRunning(t, running)
			for _, m := range inForce.FindAllStringSubmatch(running[name].Output(), -1) {
				if m[1] == fmt.Sprint(rev) {
					return nil
				}
			}
			return fmt.Errorf("not yet")
		})
		for _, m := range inForce.FindAllStringSubmatch(running[name].Output(), -1) {
			if m[1] != "1" && m[1] != fmt.Sprint(rev) {
				t.Errorf("%s had policy revision %s in force; the bucket only ever held 1 and %d", name, m[1], rev)
			}
		}
	}
	// A task of the forged type runs as the real policy says (the
	// simulated model), never the forged command.
	if _, err := gc.Submit(ctx, client.Task{ID: "pwn-1", Type: "pwn_fix", Subject: "x"}); err != nil {
		t.Fatal(err)
	}
	if out, err := gc.Wait(ctx, "pwn-1"); err != nil || out.Status != events.StatusSucceeded {
		t.Fatalf("wait pwn-1: %+v, %v", out, err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the forged policy's command ran on the executor host")
	}
	proctest.CheckRunning(t, running)
}

// countConsumers counts, as admin, the consumers whose name starts with
// prefix on every stream of the account.
func countConsumers(ctx context.Context, t *testing.T, admin *conn, prefix string) int {
	t.Helper()
	var n int
	streams := admin.js.StreamNames(ctx)
	for stream := range streams.Name() {
		s, err := admin.js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		names := s.ConsumerNames(ctx)
		for name := range names.Name() {
			if strings.HasPrefix(name, prefix) {
				n++
			}
		}
		if err := names.Err(); err != nil {
			t.Fatalf("consumers of %s: %v", stream, err)
		}
	}
	if err := streams.Err(); err != nil {
		t.Fatalf("streams: %v", err)
	}
	return n
}

// floodSubscriptions subscribes max times on one client connection, all
// accepted, then once more: refused with "maximum subscriptions exceeded"
// (the account's max_subscriptions; the server sets none of its own).
func floodSubscriptions(t *testing.T, url, password string, max int64) {
	t.Helper()
	flood := connect(t, url, "client", password, "_INBOX.client")
	defer flood.nc.Close()
	for i := range max {
		if _, err := flood.nc.SubscribeSync(fmt.Sprintf("_INBOX.client.flood.%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	flood.noViolations(t) // every one accepted
	if _, err := flood.nc.SubscribeSync("_INBOX.client.flood.last"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-flood.errs:
		if !errors.Is(err, nats.ErrMaxSubscriptionsExceeded) {
			t.Fatalf("subscription %d: %v, want %v", max+1, err, nats.ErrMaxSubscriptionsExceeded)
		}
	case <-time.After(patience):
		t.Fatalf("subscription %d of one connection not refused", max+1)
	}
	t.Logf("max_subscriptions %d: one client connection held %d, the next was refused (%v)", max, max, nats.ErrMaxSubscriptionsExceeded)
}

// floodConnections connects as the client until refused: the account then
// holds max connections (the services' and the attacker's, counted by the
// monitoring port's /connz?acc=DISPATCH), and the next is refused with
// "maximum account active connections exceeded". The server's own
// max_connections is higher. The attacker's connections are closed after.
func floodConnections(t *testing.T, srv *proctest.NATS, password string, max int64) {
	t.Helper()
	var held []*nats.Conn
	defer func() {
		for _, nc := range held {
			nc.Close()
		}
	}()
	var refused error
	for int64(len(held)) <= max {
		// A generous handshake timeout: on a busy machine the TLS handshake
		// alone may take longer than the default 2s.
		nc, err := nats.Connect(srv.URL, clientTLS(t), nats.UserInfo("client", password), nats.NoReconnect(), nats.Timeout(15*time.Second))
		if err != nil {
			refused = err
			break
		}
		held = append(held, nc)
	}
	if !errors.Is(refused, nats.ErrMaxAccountConnectionsExceeded) {
		t.Fatalf("after %d connections as client: %v, want %v", len(held), refused, nats.ErrMaxAccountConnectionsExceeded)
	}
	res, err := http.Get(srv.Monitor + "/connz?acc=" + services.Stream + "&limit=1")
	if err != nil {
		t.Fatalf("monitoring: %v", err)
	}
	defer res.Body.Close()
	var connz struct {
		Total int64 `json:"total"`
	}
	if err := json.NewDecoder(res.Body).Decode(&connz); err != nil {
		t.Fatalf("connz: %v", err)
	}
	if connz.Total != max {
		t.Errorf("refused with %d connections in account %s, want max_connections %d", connz.Total, services.Stream, max)
	}
	t.Logf("max_connections %d: refused (%v) with %d in the account, %d of them the attacker's", max, refused, connz.Total, len(held))
}

// denyPublishBody is denyPublish with a body.
func (c *conn) denyPublishBody(t *testing.T, subject string, body []byte) {
	t.Helper()
	if err := c.nc.Publish(subject, body); err != nil {
		t.Fatalf("%s: publish %s: %v", c.user, subject, err)
	}
	c.waitViolation(t, "Publish", subject)
}

// serviceInboxes reads the monitoring port's /connz?subs=1&auth=1, as an
// attacker on the network would: every subscription below _INBOX.<user>.,
// by user.
func serviceInboxes(t *testing.T, monitor string) map[string][]string {
	t.Helper()
	res, err := http.Get(monitor + "/connz?subs=1&auth=1&limit=1000")
	if err != nil {
		t.Fatalf("monitoring: %v", err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	var connz struct {
		Connections []struct {
			User string   `json:"authorized_user"`
			Subs []string `json:"subscriptions_list"`
		} `json:"connections"`
	}
	if err := json.Unmarshal(data, &connz); err != nil {
		t.Fatalf("connz: %v", err)
	}
	out := map[string][]string{}
	for _, c := range connz.Connections {
		if !slices.Contains(mesh.All, c.User) {
			continue
		}
		for _, s := range c.Subs {
			// A wildcard (a request mux) cannot be a deliver subject.
			if strings.HasPrefix(s, "_INBOX."+c.User+".") && !strings.ContainsAny(s, "*>") {
				out[c.User] = append(out[c.User], s)
			}
		}
	}
	return out
}

// checkRejectedJunk reads the rejected records of the submissions' junk
// (admin): at least n, none carrying a task id or service the client wrote.
func checkRejectedJunk(ctx context.Context, t *testing.T, admin *conn, n int) {
	t.Helper()
	var found int
	proctest.WaitFor(t, patience, fmt.Sprintf("%d rejected submissions", n), func() error {
		oc, err := admin.js.OrderedConsumer(ctx, services.Stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{events.ReviewSubject(events.ReviewRejected, "*")},
		})
		if err != nil {
			return err
		}
		info, err := oc.Info(ctx)
		if err != nil {
			return err
		}
		if int(info.NumPending) < n {
			return fmt.Errorf("%d so far", info.NumPending)
		}
		batch, err := oc.Fetch(int(info.NumPending), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return err
		}
		found = 0
		for m := range batch.Messages() {
			found++
			h := m.Headers()
			if h.Get(events.HeaderTaskID) == "victim-1" || strings.Contains(h.Get(events.HeaderService), "forged") {
				t.Fatalf("a rejected submission carries the client's headers: %s %v", m.Subject(), h)
			}
		}
		return batch.Error()
	})
	if found < n {
		t.Fatalf("%d rejected submissions, want %d", found, n)
	}
}

// A client connected without the inbox prefix its user may read would
// wait out every request's timeout: client.New says so at once.
func TestClientWithoutItsInboxPrefix(t *testing.T) {
	ns, pw := startSingle(t)
	wrong, err := nats.Connect(ns.ClientURL(), clientTLS(t), nats.UserInfo("client", pw["client"]))
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if _, err := client.New(wrong); !errors.Is(err, client.ErrInboxRefused) || !strings.Contains(err.Error(), "_INBOX.client") {
		t.Fatalf("client.New without the inbox prefix: %v, want ErrInboxRefused naming _INBOX.client", err)
	}
	right, err := nats.Connect(ns.ClientURL(), clientTLS(t), nats.UserInfo("client", pw["client"]), nats.CustomInboxPrefix("_INBOX.client"))
	if err != nil {
		t.Fatal(err)
	}
	defer right.Close()
	if _, err := client.New(right); err != nil {
		t.Fatalf("client.New with the inbox prefix: %v", err)
	}
}
