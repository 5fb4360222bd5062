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
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"dispatchmesh/events"
	"dispatchmesh/internal/mesh"
	"dispatchmesh/internal/proctest"
	"dispatchmesh/services"
	"dispatchmesh/services/intake"
)

// patience bounds every wait on the processes. It is a deadlock guard, not a
// timing assertion.
const patience = 45 * time.Second

// Every service runs as its own user from users.conf against a server
// loaded from single.conf; tasks submitted with `dispatch submit -wait` and
// through the submit API succeed end to end, and the status API answers. A
// user is refused what is not its own: the server's refusal reaches the
// error handler, and `dispatch` run under the wrong user exits naming it.
func TestServicesRunAsTheirUsers(t *testing.T) {
	natsServer, dispatch := proctest.Build(t)
	pw := proctest.SetPasswords(t)
	url := proctest.StartNATS(t, natsServer, "nats", 0).URL
	admin := connect(t, url, "admin", pw["admin"], "")
	proctest.WaitFor(t, patience, "JetStream", func() error { _, err := admin.js.AccountInfo(context.Background()); return err })

	as := func(user string) []string {
		return proctest.Env("DISPATCH_NATS_URL="+url, "DISPATCH_NATS_USER="+user, "DISPATCH_NATS_PASSWORD="+pw[user])
	}
	if out := proctest.RunToEnd(t, patience, "provision", as("admin"), dispatch, "provision"); !strings.Contains(out, "provisioned:") {
		t.Fatalf("dispatch provision said:\n%s", out)
	}

	running := map[string]*proctest.Process{}
	for _, name := range mesh.All {
		running[name] = proctest.Start(t, name, as(name), dispatch, name)
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

	// Tasks, submitted as the client user: three with the CLI, one through
	// the micro API.
	var submits []*proctest.Process
	for i := range 3 {
		submits = append(submits, proctest.Start(t, fmt.Sprintf("submit-%d", i), as("client"), dispatch,
			"submit", "-id", fmt.Sprintf("e2e-%d", i), "-type", "css_fix", "-subject", fmt.Sprintf("src/app%d.css", i),
			"-payload", `{"issue":"button misaligned"}`, "-wait", "-timeout", patience.String()))
	}
	client := connect(t, url, "client", pw["client"], "_INBOX.client")
	var reply intake.SubmitReply
	proctest.WaitFor(t, patience, "the submit API", func() error {
		proctest.CheckRunning(t, running)
		msg, err := client.nc.Request(events.SubmitAPI, []byte(`{"id":"e2e-api","type":"css_fix","subject":"src/api.css"}`), 10*time.Second)
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
	if out := proctest.RunToEnd(t, patience, "status", as("client"), dispatch, "status", "e2e-0"); !strings.Contains(out, string(events.StatusSucceeded)) {
		t.Fatalf("dispatch status e2e-0:\n%s", out)
	}

	// The task explorer as the client and the web users: intake filed every
	// task in the index (as its own user), both may read it.
	for _, user := range []string{"client", "web"} {
		out := proctest.RunToEnd(t, patience, "tasks-as-"+user, as(user), dispatch, "tasks", "-type", "css_fix")
		for _, id := range []string{"e2e-0", "e2e-1", "e2e-2", "e2e-api"} {
			if !strings.Contains(out, id) {
				t.Fatalf("dispatch tasks as %s does not list %s:\n%s", user, id, out)
			}
		}
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

	// The gate's user, on a connection of its own: the refusals reach the
	// error handler.
	gate := connect(t, url, "gate", pw["gate"], "_INBOX.gate")
	gate.denyPublish(t, events.SubmitSubject("x"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // how long the refused call waits
	defer cancel()
	if _, err := gate.js.KeyValue(ctx, services.BucketHistory); err == nil {
		t.Fatal("gate bound the history bucket")
	}
	gate.waitViolation(t, "Publish", "$JS.API.STREAM.INFO.KV_"+services.BucketHistory)
	gate.noViolations(t)

	// Every service is still running on its own durable and was refused
	// nothing.
	proctest.CheckRunning(t, running)
	for _, name := range mesh.All {
		p := running[name]
		stream := services.Stream
		if name == mesh.Reaper {
			stream = services.AdvisoryStream
		}
		if _, err := admin.js.Consumer(context.Background(), stream, name); err != nil {
			t.Errorf("consumer %s on %s: %v", name, stream, err)
		}
		if out := p.Output(); strings.Contains(strings.ToLower(out), "permission") {
			t.Errorf("%s was refused something:\n%s", name, out)
		}
	}
}
