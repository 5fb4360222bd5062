// Package deploy_test proves that the files in deploy/ are real: every NATS
// config parses, a server started from single.conf enforces the per-service
// permissions over real connections, the three cluster nodes form a JetStream
// cluster, and the container and Kubernetes manifests are complete and agree
// with the configs (users, password variables, service names).
package deploy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/intake"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Stage services: NATS user = durable consumer name = `dispatch <command>`.
var stageServices = []string{
	services.ConsumerIntake, services.ConsumerVerifier, services.ConsumerGate, services.ConsumerPrompt,
	services.ConsumerExecutor, services.ConsumerRecorder, services.ConsumerReaper,
}

// Durables on the DISPATCH stream (the reaper's is on DISPATCH_ADVISORIES).
var dispatchDurables = stageServices[:6]

const advisoryFilter = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + services.Stream + ".>"

func confFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".conf") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 7 {
		t.Fatalf("found only %d .conf files: %v", len(files), files)
	}
	return files
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ---------------------------------------------------------------------------
// (a) every .conf parses, with the users and permissions the mesh needs

func TestConfigsParse(t *testing.T) {
	pw := proctest.SetPasswords(t)
	for _, f := range confFiles(t) {
		t.Run(f, func(t *testing.T) {
			if filepath.Base(f) == "users.conf" {
				return // the users of account DISPATCH, parsed where the configs include them
			}
			opts := proctest.ParseConf(t, f)
			checkUsers(t, opts, pw)
			if !opts.JetStream || opts.StoreDir == "" {
				t.Errorf("JetStream not enabled with a store_dir (JetStream=%v StoreDir=%q)", opts.JetStream, opts.StoreDir)
			}
			if opts.Port != 4222 || opts.HTTPPort != 8222 {
				t.Errorf("listen %d, monitoring %d; want 4222 and 8222", opts.Port, opts.HTTPPort)
			}
			// Monitoring has no authentication and /connz names every
			// service's inbox: loopback only, but in Kubernetes, where the
			// kubelet probes it and a NetworkPolicy guards it
			// (TestMonitoringPortGuarded).
			if k8s := strings.HasPrefix(f, "k8s/"); !k8s && opts.HTTPHost != "127.0.0.1" {
				t.Errorf("monitoring listens on %q, want 127.0.0.1", opts.HTTPHost)
			}
			if opts.JetStreamMaxStore <= 0 || opts.JetStreamMaxMemory <= 0 {
				t.Errorf("JetStream limits not set: max_file_store %d, max_memory_store %d", opts.JetStreamMaxStore, opts.JetStreamMaxMemory)
			}
			// TLS for every client, and for the routes of a cluster, which
			// must present a certificate of the CA (deploy/README.md#tls).
			if opts.TLSConfig == nil || opts.AllowNonTLS || opts.TLSConfig.MinVersion < tls.VersionTLS12 {
				t.Errorf("clients are not required to use TLS (tls %v, allow_non_tls %v)", opts.TLSConfig != nil, opts.AllowNonTLS)
			}
			if opts.Cluster.Port != 0 && (opts.Cluster.TLSConfig == nil || opts.Cluster.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert) {
				t.Errorf("the routes do not verify each other with TLS (cluster tls %v)", opts.Cluster.TLSConfig != nil)
			}
		})
	}
}

func checkUsers(t *testing.T, opts *server.Options, pw map[string]string) {
	t.Helper()
	var names []string
	for _, u := range opts.Users {
		names = append(names, u.Username)
		if want, ok := pw[u.Username]; !ok {
			t.Errorf("unexpected user %q", u.Username)
			continue
		} else if u.Password != want {
			t.Errorf("user %s: password is not the value of $%s", u.Username, proctest.PasswordVar(u.Username))
		}
		if u.Account == nil || u.Account.Name != services.Stream {
			t.Errorf("user %s is not in account DISPATCH", u.Username)
		}
		checkPermissions(t, u)
	}
	slices.Sort(names)
	want := slices.Clone(proctest.Users)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("users = %v, want %v", names, want)
	}
}

func checkPermissions(t *testing.T, u *server.User) {
	t.Helper()
	p := u.Permissions
	if p == nil || p.Publish == nil || p.Subscribe == nil {
		t.Errorf("user %s has no publish/subscribe permissions", u.Username)
		return
	}
	if u.Username == "admin" {
		if !slices.Equal(p.Publish.Allow, []string{">"}) || !slices.Equal(p.Subscribe.Allow, []string{">"}) {
			t.Errorf("admin must have everything, has %+v", p)
		}
		return
	}
	if p.Response != nil {
		// allow_responses lets a requester choose the subject the responder
		// publishes to; deny lists do not override it.
		t.Errorf("user %s uses allow_responses", u.Username)
	}
	if slices.Contains(p.Publish.Allow, ">") {
		t.Errorf("user %s may publish everywhere", u.Username)
	}
	inbox := "_INBOX." + u.Username + ".>"
	if !slices.Contains(p.Subscribe.Allow, inbox) {
		t.Errorf("user %s may not subscribe to its inbox %s", u.Username, inbox)
	}
	// Every service and the review page serve their micro service
	// dispatch-<name> ($SRV.PING|INFO|STATS, dispatch.health.<name>) and
	// answer on the requester's inbox, never on a service's.
	ops := services.OpsName(u.Username)
	opsSubs := []string{"$SRV.*", "$SRV.*." + ops, "$SRV.*." + ops + ".*", services.HealthSubject(u.Username)}
	serves := slices.Contains(mesh.All, u.Username) || u.Username == "web" || u.Username == mesh.Webhook
	if serves {
		for _, s := range opsSubs {
			if !slices.Contains(p.Subscribe.Allow, s) {
				t.Errorf("user %s may not subscribe to %s: its micro service %s would not answer", u.Username, s, ops)
			}
		}
		if !slices.Contains(p.Publish.Allow, "_INBOX.>") {
			t.Errorf("user %s may not publish on _INBOX.>: its micro service could not reply", u.Username)
		}
		for _, svc := range append(slices.Clone(mesh.All), mesh.Webhook) {
			if d := "_INBOX." + svc + ".>"; !slices.Contains(p.Publish.Deny, d) {
				t.Errorf("user %s may publish on %s, another service's inbox", u.Username, d)
			}
		}
	} else if slices.Contains(p.Publish.Allow, "_INBOX.>") {
		t.Errorf("user %s serves nothing but may publish on _INBOX.>", u.Username)
	}
	for _, s := range p.Subscribe.Allow {
		// intake serves the micro API; its waits listen for rejections.
		// The executor hears a human's cancel to end the task's call; the
		// recorder hears every action to count the tasks a human ends.
		if (u.Username == "executor" || u.Username == "recorder") && s == events.ReviewSubject(events.ReviewAction, "*") {
			continue
		}
		if s == inbox || (serves && slices.Contains(opsSubs, s)) || (u.Username == "intake" && (s == events.SubmitAPI || s == intake.StatusAPI || s == intake.WaitAPI || s == events.APIWatch ||
			s == events.ReviewSubject(events.ReviewRejected, "*") || s == "$SRV.*."+services.MicroService || s == "$SRV.*."+services.MicroService+".*")) {
			continue
		}
		t.Errorf("user %s may subscribe to %q (only its own inbox, its micro services and what it listens to)", u.Username, s)
	}
	if slices.Contains(dispatchDurables, u.Username) || u.Username == services.ConsumerReaper {
		stream := services.StreamOf(u.Username)
		for _, s := range []string{
			"$JS.API.CONSUMER.INFO." + stream + "." + u.Username,
			"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + u.Username,
			"$JS.ACK." + stream + "." + u.Username + ".>",
			"$JS.API.CONSUMER.CREATE." + stream + "." + u.Username,
			"$JS.API.CONSUMER.CREATE." + stream + "." + u.Username + ".>",
			"$JS.API.CONSUMER.DURABLE.CREATE." + stream + "." + u.Username,
			"$JS.API.DIRECT.GET." + services.Stream,
			"$JS.API.DIRECT.GET." + services.Stream + ".>",
			"$JS.API.STREAM.MSG.GET." + services.Stream,
			events.ReviewSubject(events.ReviewPoison, "*"),
		} {
			if !slices.Contains(p.Publish.Allow, s) {
				t.Errorf("service %s lacks publish %s", u.Username, s)
			}
		}
	}
	if access, ok := mesh.Buckets[u.Username]; ok {
		checkBuckets(t, u.Username, access, p.Publish.Allow)
		checkStreams(t, u.Username, access, p.Publish.Allow)
	}
	if access, ok := reviewAccess[u.Username]; ok {
		checkStreams(t, u.Username, access, p.Publish.Allow)
		for _, b := range access.Reads { // watched by the review client: read-only
			for _, s := range watchGrants(b) {
				if !slices.Contains(p.Publish.Allow, s) {
					t.Errorf("user %s watches bucket %s (review client) but lacks publish %s", u.Username, b, s)
				}
			}
			if slices.Contains(p.Publish.Allow, "$KV."+b+".>") {
				t.Errorf("user %s may write bucket %s, which the review client only watches", u.Username, b)
			}
		}
	}
	if u.Username == "web" {
		// The review page's live feed and search index: one watch of the
		// task bucket per process (which web also writes: decisions).
		for _, s := range watchGrants(services.BucketTasks) {
			if !slices.Contains(p.Publish.Allow, s) {
				t.Errorf("user web follows the task bucket (the live feed) but lacks publish %s", s)
			}
		}
	}
	if u.Username == "auditor" {
		// The operators' read-only identity reads every bucket (dispatch
		// review, audit, status -v, the nats CLI) and writes none.
		for _, b := range services.AllBuckets {
			for _, s := range watchGrants(b) {
				if !slices.Contains(p.Publish.Allow, s) {
					t.Errorf("user auditor reads every bucket but lacks publish %s", s)
				}
			}
		}
		for _, s := range p.Publish.Allow {
			if strings.HasPrefix(s, "$KV.") {
				t.Errorf("user auditor may publish %s: it writes no bucket", s)
			}
		}
	}
	checkKnownNames(t, u.Username, slices.Concat(p.Publish.Allow, p.Publish.Deny))
	if u.Username == "client" {
		// Clients go through the API only: no stream, consumer or bucket.
		for _, s := range p.Publish.Allow {
			// Nothing a stream captures either: a captured publish's PubAck
			// goes to the reply the publisher names, unchecked.
			if !strings.HasPrefix(s, "dispatch.api.") {
				t.Errorf("user client may publish %s: clients send API requests only", s)
			}
		}
		if !slices.Contains(p.Publish.Allow, events.APIWatch) {
			t.Errorf("user client may not ask %s: client.Watch and submit -wait need it", events.APIWatch)
		}
	}
	if slices.ContainsFunc(p.Publish.Allow, func(s string) bool { return strings.HasPrefix(s, "$JS.API.CONSUMER.CREATE.DISPATCH.>") }) {
		for _, d := range dispatchDurables {
			for _, s := range []string{
				"$JS.API.CONSUMER.CREATE." + services.Stream + "." + d,
				"$JS.API.CONSUMER.CREATE." + services.Stream + "." + d + ".>",
				"$JS.API.CONSUMER.MSG.NEXT." + services.Stream + "." + d,
				"$JS.API.CONSUMER.DELETE." + services.Stream + "." + d,
			} {
				if !slices.Contains(p.Publish.Deny, s) {
					t.Errorf("user %s: %s is not denied", u.Username, s)
				}
			}
		}
	}
}

// checkBuckets compares a service's KV grants with mesh.Buckets, the
// buckets the service binds: every one it uses is readable (bind, get,
// watch), only those it writes are writable, and no other is named.
func checkBuckets(t *testing.T, user string, access mesh.Access, allow []string) {
	t.Helper()
	for _, b := range services.AllBuckets {
		switch {
		case slices.Contains(access.All(), b):
			for _, s := range watchGrants(b) {
				if !slices.Contains(allow, s) {
					t.Errorf("user %s uses bucket %s (mesh.Buckets) but lacks publish %s", user, b, s)
				}
			}
			if writes := slices.Contains(access.Writes, b); slices.Contains(allow, "$KV."+b+".>") != writes {
				t.Errorf("user %s: $KV.%s.> granted must be %v (mesh.Buckets writes %v)", user, b, writes, access.Writes)
			}
		default:
			for _, s := range allow {
				if strings.Contains(s, "KV_"+b) || strings.HasPrefix(s, "$KV."+b+".") {
					t.Errorf("user %s may %s, but does not use bucket %s (mesh.Buckets)", user, s, b)
				}
			}
		}
	}
}

// watchGrants are the grants that bind bucket b, read it and watch it.
func watchGrants(b string) []string {
	return []string{
		"$JS.API.STREAM.INFO.KV_" + b, "$JS.API.STREAM.MSG.GET.KV_" + b,
		"$JS.API.DIRECT.GET.KV_" + b, "$JS.API.DIRECT.GET.KV_" + b + ".>",
		"$JS.API.CONSUMER.CREATE.KV_" + b + ".>", "$JS.API.CONSUMER.DELETE.KV_" + b + ".>", "$JS.FC.KV_" + b + ".>",
	}
}

// reviewAccess is what the review client (dispatch web, dispatch review)
// and the task explorer use beyond the stream DISPATCH and the task bucket,
// by user: web follows the trust outcomes and watches the gate's facts
// (trust.View, as the gate sees them) and lists the held index (the held
// tasks of the review queue); client only lists tasks.
var reviewAccess = map[string]mesh.Access{
	"web":    {Reads: []string{services.BucketTrust, services.BucketPolicy, services.BucketHeld}, Follows: []string{services.OutcomeStream}},
	"client": {},
}

// followGrants are how each outcome stream is read (mesh.Access.Follows):
// the trust outcomes with a follow.Follower (trust.View: stream info, then
// push consumers it names, re-creates and deletes; no acks),
// and a direct get of a type's newest outcome (View.Sync, before a retry).
var followGrants = map[string][]string{
	services.OutcomeStream: {
		"$JS.API.STREAM.INFO." + services.OutcomeStream,
		"$JS.API.DIRECT.GET." + services.OutcomeStream + ".>",
		"$JS.API.CONSUMER.CREATE." + services.OutcomeStream + ".>",
		"$JS.API.CONSUMER.DELETE." + services.OutcomeStream + ".*",
	},
}

// publishGrants are the subjects of each outcome stream
// (mesh.Access.Publishes), as services.Provision creates it.
var publishGrants = map[string]string{
	services.OutcomeStream: trust.OutcomeFilter,
}

// outcomeStreams are the streams of followGrants, sorted.
func outcomeStreams() []string {
	var all []string
	for s := range followGrants {
		all = append(all, s)
	}
	slices.Sort(all)
	return all
}

// grantStream is the stream a JetStream grant names ("KV_<bucket>" for a
// bucket's), "" for any other subject.
func grantStream(s string) string {
	t := strings.Split(s, ".")
	switch {
	case len(t) >= 3 && t[0] == "$JS" && (t[1] == "ACK" || t[1] == "FC"):
		return t[2]
	case len(t) >= 5 && t[0] == "$JS" && t[1] == "API" && (t[2] == "STREAM" || t[2] == "DIRECT") && t[3] != "MSG":
		return t[4] // STREAM.INFO.<S>, DIRECT.GET.<S>[.…]
	case len(t) >= 6 && t[0] == "$JS" && t[1] == "API" && t[2] == "STREAM": // STREAM.MSG.GET.<S>
		return t[5]
	case len(t) >= 6 && t[0] == "$JS" && t[1] == "API" && t[2] == "CONSUMER" && (t[3] == "MSG" || t[3] == "DURABLE"):
		return t[5] // MSG.NEXT.<S>.<d>, DURABLE.CREATE.<S>.<d>
	case len(t) >= 5 && t[0] == "$JS" && t[1] == "API" && t[2] == "CONSUMER":
		return t[4] // CREATE|INFO|DELETE.<S>…
	}
	return ""
}

// checkStreams compares a user's grants on the outcome streams with what
// it Follows and Publishes to (mesh.Buckets, reviewAccess): a stream it
// follows is readable the way it is read and no other way, one it does
// not follow is named by none of its grants, and it may publish to a
// stream's subjects exactly when it publishes to the stream.
func checkStreams(t *testing.T, user string, access mesh.Access, allow []string) {
	t.Helper()
	for _, s := range slices.Concat(access.Follows, access.Publishes) {
		if _, ok := followGrants[s]; !ok {
			t.Errorf("user %s uses stream %s, which deploy_test.go does not know how to grant: add it to followGrants and publishGrants", user, s)
		}
	}
	for _, stream := range outcomeStreams() {
		follows := slices.Contains(access.Follows, stream)
		// A publisher may read back, by sequence, what a duplicate answer names.
		for _, s := range allow {
			if grantStream(s) == stream && !(follows && slices.Contains(followGrants[stream], s)) && !(slices.Contains(access.Publishes, stream) && s == "$JS.API.DIRECT.GET."+stream) {
				t.Errorf("user %s may %s, but does not read stream %s that way (it follows %v)", user, s, stream, access.Follows)
			}
		}
		if follows {
			for _, s := range followGrants[stream] {
				if !slices.Contains(allow, s) {
					t.Errorf("user %s follows stream %s (mesh.Buckets, reviewAccess) but lacks publish %s", user, stream, s)
				}
			}
		}
		subjects, publishes := publishGrants[stream], slices.Contains(access.Publishes, stream)
		if publishes && !slices.Contains(allow, subjects) {
			t.Errorf("user %s publishes to stream %s (mesh.Buckets, reviewAccess) but lacks publish %s", user, stream, subjects)
		}
		for _, s := range allow {
			if server.SubjectsCollide(s, subjects) && !(publishes && s == subjects) {
				t.Errorf("user %s may publish %s, into stream %s (%s), which it does not publish to (mesh.Buckets, reviewAccess)", user, s, stream, subjects)
			}
		}
	}
}

// checkKnownNames fails on a grant for a stream or bucket the mesh does not
// provision (one it no longer uses, a typo).
func checkKnownNames(t *testing.T, user string, grants []string) {
	t.Helper()
	known := []string{services.Stream, services.SubmitStream, services.AdvisoryStream, services.CounterStream}
	known = append(known, outcomeStreams()...)
	for _, b := range services.AllBuckets {
		known = append(known, "KV_"+b)
	}
	for _, s := range grants {
		stream := grantStream(s)
		if b, ok := strings.CutPrefix(s, "$KV."); ok {
			b, _, _ = strings.Cut(b, ".")
			stream = "KV_" + b
		}
		if stream != "" && stream != "*" && !slices.Contains(known, stream) {
			t.Errorf("user %s: %s names %s, which the mesh does not provision", user, s, stream)
		}
	}
}

// The passwords exist only in the environment: no default, no literal.
func TestPasswordsComeFromEnvironment(t *testing.T) {
	proctest.SetPasswords(t)
	single := proctest.ConfCopy(t, filepath.Join("nats", "single.conf"), "") // with TLS files to load

	os.Unsetenv(proctest.PasswordVar("gate")) // t.Setenv restores it
	_, err := server.ProcessConfigFile(single)
	if err == nil || !strings.Contains(err.Error(), proctest.PasswordVar("gate")) {
		t.Fatalf("without $%s: err = %v, want a missing variable error", proctest.PasswordVar("gate"), err)
	}

	// The Secret template's placeholders must not be usable passwords.
	m := regexp.MustCompile(`(?m)^\s*` + proctest.PasswordVar("gate") + `:\s*"([^"]*)"`).FindStringSubmatch(readFile(t, filepath.Join("k8s", "secrets.template.yaml")))
	if m == nil {
		t.Fatal("secrets.template.yaml has no NATS_PASSWORD_GATE placeholder")
	}
	t.Setenv(proctest.PasswordVar("gate"), m[1])
	if _, err := server.ProcessConfigFile(single); err == nil {
		t.Errorf("the Secret template placeholder %q parses as a password", m[1])
	}

	literal := regexp.MustCompile(`^\s*(password|pass)\s*[:=]?\s*(\S+)`)
	for _, f := range confFiles(t) {
		for i, line := range strings.Split(readFile(t, f), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			if m := literal.FindStringSubmatch(line); m != nil && !strings.HasPrefix(m[2], "$") {
				t.Errorf("%s:%d: literal password %q", f, i+1, m[2])
			}
		}
	}
}

func TestKubernetesUsersConfIsACopy(t *testing.T) {
	if readFile(t, filepath.Join("nats", "users.conf")) != readFile(t, filepath.Join("k8s", "nats", "users.conf")) {
		t.Fatal("k8s/nats/users.conf differs from nats/users.conf: cp deploy/nats/users.conf deploy/k8s/nats/users.conf")
	}
}

// ---------------------------------------------------------------------------
// (b) a real server from single.conf enforces the permissions

type conn struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

// connect logs in as user; inbox is the custom inbox prefix ("" = default).
// Asynchronous errors (permission violations) go to c.errs.
func connect(t *testing.T, serverURL, user, password, inbox string) *conn {
	t.Helper()
	c := &conn{user: user, errs: make(chan error, 256)}
	opts := []nats.Option{
		clientTLS(t),
		nats.UserInfo(user, password),
		nats.Name("deploy-test-" + user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.errs <- err:
			default:
			}
		}),
	}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(serverURL, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(func() {
		nc.Close()
		if t.Failed() { // a timed-out call is usually a refused one: show why
			for {
				select {
				case err := <-c.errs:
					t.Logf("%s: asynchronous error: %v", user, err)
				default:
					return
				}
			}
		}
	})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c.nc, c.js = nc, js
	return c
}

// clientTLS trusts the test CA (proctest.Certs) the servers of these tests
// present: they require TLS, as the configs do.
func clientTLS(t testing.TB) nats.Option {
	return nats.Secure(&tls.Config{RootCAs: proctest.CAPool(t), MinVersion: tls.VersionTLS12})
}

// waitViolation waits for the server's permission violation for kind
// ("Publish" or "Subscription") on subject. A forbidden operation returns no
// error: the violation arrives asynchronously through nats.ErrorHandler.
func (c *conn) waitViolation(t *testing.T, kind, subject string) {
	t.Helper()
	want := strings.ToLower(fmt.Sprintf("permissions violation for %s to %q", kind, subject))
	timeout := time.After(15 * time.Second)
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(strings.ToLower(err.Error()), want) {
				return
			}
			t.Errorf("%s: unexpected asynchronous error: %v", c.user, err)
		case <-timeout:
			t.Fatalf("%s: no permission violation for %s to %q", c.user, kind, subject)
		}
	}
}

// denyPublish publishes to subject and expects the permission violation.
func (c *conn) denyPublish(t *testing.T, subject string) {
	t.Helper()
	if err := c.nc.Publish(subject, []byte(`{"forbidden":true}`)); err != nil {
		t.Fatalf("%s: publish %s: %v", c.user, subject, err)
	}
	c.waitViolation(t, "Publish", subject)
}

// denySubscribe subscribes to subject and expects the permission violation.
func (c *conn) denySubscribe(t *testing.T, subject string) {
	t.Helper()
	sub, err := c.nc.SubscribeSync(subject)
	if err != nil {
		t.Fatalf("%s: subscribe %s: %v", c.user, subject, err)
	}
	defer sub.Unsubscribe()
	c.waitViolation(t, "Subscription", subject)
}

// noViolations fails on any asynchronous error so far: the operations that
// were meant to be allowed really were. The server reports violations in
// order, so for a restricted user a refused publish to a sentinel subject
// flushes out every earlier one; admin, who is refused nothing, gets a
// flush round trip.
func (c *conn) noViolations(t *testing.T) {
	t.Helper()
	if c.user != "admin" {
		c.denyPublish(t, "deploy.test.sentinel") // fails on anything before it
		return
	}
	if err := c.nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatalf("%s: flush: %v", c.user, err)
	}
	for {
		select {
		case err := <-c.errs:
			t.Errorf("%s: unexpected asynchronous error: %v", c.user, err)
		default:
			return
		}
	}
}

func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("new server: %v", err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats server not ready")
	}
	return ns
}

// startSingle runs single.conf on random ports with its store in a temp dir.
func startSingle(t *testing.T) (*server.Server, map[string]string) {
	t.Helper()
	pw := proctest.SetPasswords(t)
	opts := proctest.ParseConf(t, filepath.Join("nats", "single.conf"))
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.HTTPHost, opts.HTTPPort = "127.0.0.1", -1
	opts.StoreDir = t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	return startServer(t, opts), pw
}

// consumerConfigs is what provisioning creates: one durable pull consumer per stage.
func consumerConfigs() map[string]jetstream.ConsumerConfig {
	cfg := func(durable string, maxDeliver int, filters ...string) jetstream.ConsumerConfig {
		c := jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: maxDeliver, AckWait: 30 * time.Second}
		if len(filters) == 1 {
			c.FilterSubject = filters[0]
		} else {
			c.FilterSubjects = filters
		}
		return c
	}
	return map[string]jetstream.ConsumerConfig{
		services.ConsumerIntake:   cfg(services.ConsumerIntake, 5, events.SubmitFilters...),
		services.ConsumerVerifier: cfg(services.ConsumerVerifier, 5, events.StageFilter(events.StageQueued), events.StageFilter(events.StageRetry)),
		services.ConsumerGate:     cfg(services.ConsumerGate, 5, events.StageFilter(events.StageVerified)),
		services.ConsumerPrompt:   cfg(services.ConsumerPrompt, 5, events.StageFilter(events.StageAdmitted)),
		// MaxDeliver 1: the reaper scenario below exhausts it with one Nak.
		services.ConsumerExecutor: cfg(services.ConsumerExecutor, 1, events.StageFilter(events.StagePrompted)),
		services.ConsumerRecorder: cfg(services.ConsumerRecorder, 5, events.StageFilter(events.StageExecuted)),
		services.ConsumerReaper:   cfg(services.ConsumerReaper, 5),
	}
}

func streamOf(durable string) string { return services.StreamOf(durable) }

// streamSubjects are the DISPATCH stream's subjects. Not events.AllSubjects
// (dispatch.>): that also captures the request subject dispatch.api.submit, so
// the stream would store every API request and answer it with a PubAck that
// races (and usually beats) the micro service's reply.
var streamSubjects = []string{events.TaskRoot + ".>", events.ReviewFilter, events.IndexFilter}

// provision does what `dispatch up`/provision does, as admin.
func provision(ctx context.Context, t *testing.T, admin *conn, replicas int) {
	t.Helper()
	_, err := admin.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        services.Stream,
		Subjects:    streamSubjects,
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      30 * 24 * time.Hour,
		Duplicates:  10 * time.Minute,
		AllowDirect: true,
		Replicas:    replicas,
	})
	if err != nil {
		t.Fatalf("admin creates stream %s: %v", services.Stream, err)
	}
	if _, err := admin.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       services.SubmitStream,
		Subjects:   []string{events.SubmitRoot, events.SubmitFilter},
		Retention:  jetstream.LimitsPolicy,
		Storage:    jetstream.FileStorage,
		MaxAge:     30 * 24 * time.Hour,
		Duplicates: 2 * time.Minute,
		Replicas:   replicas,
	}); err != nil {
		t.Fatalf("admin creates stream %s: %v", services.SubmitStream, err)
	}
	if _, err := admin.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:      services.AdvisoryStream,
		Subjects:  []string{advisoryFilter},
		Retention: jetstream.LimitsPolicy,
		Storage:   jetstream.FileStorage,
		MaxAge:    30 * 24 * time.Hour,
		Replicas:  replicas,
	}); err != nil {
		t.Fatalf("admin creates stream %s: %v", services.AdvisoryStream, err)
	}
	for durable, cfg := range consumerConfigs() {
		cfg.Replicas = replicas
		if _, err := admin.js.CreateOrUpdateConsumer(ctx, streamOf(durable), cfg); err != nil {
			t.Fatalf("admin creates consumer %s: %v", durable, err)
		}
	}
	for _, b := range testBuckets {
		kv, err := admin.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b, History: 5, Replicas: replicas})
		if err != nil {
			t.Fatalf("admin creates bucket %s: %v", b, err)
		}
		if _, err := kv.Put(ctx, "seed", []byte(`{"seed":true}`)); err != nil {
			t.Fatalf("admin puts seed in %s: %v", b, err)
		}
	}
	// The outcome stream, as services.Provision creates it, with a first
	// outcome to read.
	for stream, subjects := range publishGrants {
		if _, err := admin.js.CreateStream(ctx, jetstream.StreamConfig{
			Name: stream, Subjects: []string{subjects}, Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage,
			MaxMsgsPerSubject: 10, AllowDirect: true, Replicas: replicas,
		}); err != nil {
			t.Fatalf("admin creates stream %s: %v", stream, err)
		}
	}
	if _, err := admin.js.PublishMsg(ctx, seedOutcome(t, "seed")); err != nil {
		t.Fatalf("admin publishes the seed outcome: %v", err)
	}
	// A first event no stage consumes, so GetMsg(1) has something to read.
	if _, err := admin.js.Publish(ctx, events.ReviewSubject(events.ReviewRejected, "seed"), []byte(`{}`)); err != nil {
		t.Fatalf("admin publishes seed event: %v", err)
	}
}

// testBuckets are the buckets provision creates (the policy bucket is
// tested with the binaries, processes_test.go).
var testBuckets = []string{services.BucketTasks, services.BucketTrust, services.BucketHistory, services.BucketHeld}

// The outcome the tests publish and read: one of seedType.
const seedType = "css_fix"

// seedOutcome is one outcome with key as the recorder publishes it on the
// trust outcomes.
func seedOutcome(t *testing.T, key string) *nats.Msg {
	t.Helper()
	m, err := trust.OutcomeMsg(seedType, trust.Outcome{Key: key, At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testCtx bounds one scenario, so a refused call fails it without starving the next.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSingleNode(t *testing.T) {
	ns, pw := startSingle(t)
	ctx := testCtx(t)

	acc, err := ns.LookupAccount(services.Stream)
	if err != nil || !acc.JetStreamEnabled() {
		t.Fatalf("account DISPATCH: JetStream not enabled (%v)", err)
	}
	res, err := http.Get("http://" + ns.MonitorAddr().String() + "/healthz?js-enabled-only=true")
	if err != nil {
		t.Fatalf("monitoring: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("monitoring /healthz: %s", res.Status)
	}
	if _, err := nats.Connect(ns.ClientURL(), clientTLS(t), nats.UserInfo("gate", "wrong")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("gate with a wrong password: %v, want %v", err, nats.ErrAuthorization)
	}
	if _, err := nats.Connect(ns.ClientURL(), clientTLS(t)); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connection: %v, want %v", err, nats.ErrAuthorization)
	}

	admin := connect(t, ns.ClientURL(), "admin", pw["admin"], "")
	provision(ctx, t, admin, 1)

	t.Run("services", func(t *testing.T) { testServices(t, ns.ClientURL(), pw) })
	t.Run("gate", func(t *testing.T) { testGate(testCtx(t), t, ns.ClientURL(), pw, admin) })
	t.Run("client", func(t *testing.T) { testClient(testCtx(t), t, ns.ClientURL(), pw, admin) })
	t.Run("micro", func(t *testing.T) { testMicro(testCtx(t), t, ns.ClientURL(), pw, admin) })
	t.Run("reaper", func(t *testing.T) { testReaper(testCtx(t), t, ns.ClientURL(), pw, admin) })
	t.Run("web", func(t *testing.T) { testWeb(testCtx(t), t, ns.ClientURL(), pw) })
	admin.noViolations(t)
}

// serviceSpec is what a stage publishes into DISPATCH; its buckets and
// outcome streams are its row of mesh.Buckets.
type serviceSpec struct {
	outputs []string // subjects it publishes into DISPATCH
	foreign string   // an output of another stage it must not publish
}

var serviceSpecs = map[string]serviceSpec{
	services.ConsumerIntake: {
		outputs: []string{
			events.TaskSubject("s1", events.StageQueued), events.ReviewSubject(events.ReviewRejected, "s1"),
			events.SubmitSubject("smoke"),                  // the submit API queues what it accepts
			events.TaskSubject("s1", events.StageVerified), // a type without a verifier: straight to the gate
		},
		foreign: events.TaskSubject("s1", events.StageAdmitted),
	},
	services.ConsumerVerifier: {
		outputs: []string{events.TaskSubject("s1", events.StageVerified), events.TaskSubject("s1", events.StageCancelled)},
		foreign: events.TaskSubject("s1", events.StageAdmitted),
	},
	services.ConsumerGate: {
		outputs: []string{
			events.TaskSubject("s1", events.StageAdmitted), events.ReviewSubject(events.ReviewGated, "s1"),
			events.TaskSubject("s1", events.StageHeld),         // held for trust, waiting for canaries
			events.ReviewSubject(events.ReviewEscalated, "s1"), // a handoff before a retry (rung_rate)
		},
		foreign: events.TaskSubject("s1", events.StageSucceeded),
	},
	services.ConsumerPrompt: {
		outputs: []string{events.TaskSubject("s1", events.StagePrompted)},
		foreign: events.TaskSubject("s1", events.StageExecuted),
	},
	services.ConsumerExecutor: {
		outputs: []string{events.TaskSubject("s1", events.StageExecuted)},
		foreign: events.TaskSubject("s1", events.StageSucceeded),
	},
	services.ConsumerRecorder: {
		outputs: []string{
			events.TaskSubject("s1", events.StageSucceeded), events.TaskSubject("s1", events.StageRetry),
			events.TaskSubject("s1", events.StageVerified), // a retry of a type without a verifier
			events.ReviewSubject(events.ReviewEscalated, "s1"), events.ReviewSubject(events.ReviewStuck, "s1"),
		},
		foreign: events.TaskSubject("s1", events.StageAdmitted),
	},
	services.ConsumerReaper: {
		foreign: events.ReviewSubject(events.ReviewEscalated, "s1"),
	},
}

// Every stage user can bind to (and re-create) its own durable, pull from it,
// publish its outputs and a dead letter, read a stream message by sequence,
// use its KV buckets and outcome streams as mesh.Buckets says, and nothing
// else that was tried.
func testServices(t *testing.T, serverURL string, pw map[string]string) {
	for _, name := range stageServices {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			spec, access := serviceSpecs[name], mesh.Buckets[name]
			c := connect(t, serverURL, name, pw[name], "_INBOX."+name)

			cfg := consumerConfigs()[name]
			if _, err := c.js.CreateOrUpdateConsumer(ctx, streamOf(name), cfg); err != nil {
				t.Fatalf("CreateOrUpdateConsumer(%s): %v", name, err)
			}
			cons, err := c.js.Consumer(ctx, streamOf(name), name)
			if err != nil {
				t.Fatalf("bind consumer %s: %v", name, err)
			}
			ackSmoke(ctx, t, cons, name) // earlier stages' smoke outputs

			for _, subj := range append(slices.Clone(spec.outputs), events.ReviewSubject(events.ReviewPoison, "s1")) {
				ack, err := c.js.Publish(ctx, subj, []byte(smokeBody))
				if err != nil {
					t.Fatalf("publish %s: %v", subj, err)
				}
				want := services.Stream
				if services.FromClient(subj) {
					want = services.SubmitStream
				}
				if ack.Stream != want {
					t.Fatalf("publish %s stored in %q, want %q", subj, ack.Stream, want)
				}
			}

			stream, err := c.js.Stream(ctx, services.Stream)
			if err != nil {
				t.Fatalf("stream info %s: %v", services.Stream, err)
			}
			if _, err := stream.GetMsg(ctx, 1); err != nil {
				t.Fatalf("get message 1 of %s: %v", services.Stream, err)
			}

			for _, b := range testBuckets {
				switch {
				case slices.Contains(access.Writes, b):
					kv, err := c.js.KeyValue(ctx, b)
					if err != nil {
						t.Fatalf("bind bucket %s: %v", b, err)
					}
					if _, err := kv.Put(ctx, "smoke-"+name, []byte(`1`)); err != nil {
						t.Fatalf("put in %s: %v", b, err)
					}
					if _, err := kv.Get(ctx, "seed"); err != nil {
						t.Fatalf("get from %s: %v", b, err)
					}
				case slices.Contains(access.Reads, b):
					kv, err := c.js.KeyValue(ctx, b)
					if err != nil {
						t.Fatalf("bind bucket %s: %v", b, err)
					}
					if _, err := kv.Get(ctx, "seed"); err != nil {
						t.Fatalf("get from %s: %v", b, err)
					}
					c.denyPublish(t, "$KV."+b+".smoke-"+name)
				default:
					c.denyPublish(t, "$KV."+b+".smoke-"+name)
				}
			}
			testOutcomeStreams(ctx, t, c, access)

			c.denyPublish(t, spec.foreign)
			if name != services.ConsumerIntake {
				c.denyPublish(t, events.SubmitSubject("css_fix"))
			}
			c.denyPublish(t, "$JS.API.STREAM.DELETE."+services.Stream)
			other := services.ConsumerGate
			if name == other {
				other = services.ConsumerPrompt
			}
			c.denyPublish(t, "$JS.API.CONSUMER.MSG.NEXT."+services.Stream+"."+other)
			c.denySubscribe(t, "_INBOX.>")
			c.noViolations(t)
		})
	}
	// A later stage's smoke output may be an earlier stage's input (the
	// recorder's retry is the verifier's, its verified — a retry of a type
	// without a verifier — the gate's): each stage acks what is left on its
	// durable, so the scenarios after this one start from empty consumers.
	t.Run("leftovers", func(t *testing.T) {
		ctx := testCtx(t)
		for _, name := range dispatchDurables {
			c := connect(t, serverURL, name, pw[name], "_INBOX."+name)
			cons, err := c.js.Consumer(ctx, services.StreamOf(name), name)
			if err != nil {
				t.Fatalf("bind consumer %s: %v", name, err)
			}
			ackSmoke(ctx, t, cons, name)
			ci, err := cons.Info(ctx)
			if err != nil {
				t.Fatalf("consumer info %s: %v", name, err)
			}
			if ci.NumPending != 0 || ci.NumAckPending != 0 {
				t.Fatalf("%s after the smoke: %d pending, %d unacked; want none", name, ci.NumPending, ci.NumAckPending)
			}
			c.noViolations(t)
		}
	})
}

// smokeBody is what testServices publishes as each stage's outputs.
const smokeBody = `{"smoke":true}`

// ackSmoke has stage name pull what is on its durable — the other stages'
// smoke outputs, nothing else — and ack each.
func ackSmoke(ctx context.Context, t *testing.T, cons jetstream.Consumer, name string) {
	t.Helper()
	batch, err := cons.FetchNoWait(20)
	if err != nil {
		t.Fatalf("fetch from %s: %v", name, err)
	}
	for msg := range batch.Messages() {
		if string(msg.Data()) != smokeBody {
			t.Fatalf("%s got %s %q, not a smoke output", name, msg.Subject(), msg.Data())
		}
		// DoubleAck waits for the server's confirmation: the ack was allowed.
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatalf("ack on %s: %v", name, err)
		}
	}
	if err := batch.Error(); err != nil {
		t.Fatalf("fetch from %s: %v", name, err)
	}
}

// testOutcomeStreams has c read the outcome streams it follows the way the
// services do (trust.View), publish to those it publishes to as the
// recorder does, and be refused the others.
func testOutcomeStreams(ctx context.Context, t *testing.T, c *conn, access mesh.Access) {
	t.Helper()
	if slices.Contains(access.Follows, services.OutcomeStream) {
		var facts jetstream.KeyValue // the gate's facts, where it may watch them
		if slices.Contains(access.All(), services.BucketTrust) {
			var err error
			if facts, err = c.js.KeyValue(ctx, services.BucketTrust); err != nil {
				t.Fatalf("bind bucket %s: %v", services.BucketTrust, err)
			}
		}
		view, err := trust.NewView(ctx, c.js, facts, quiet)
		if err != nil {
			t.Fatalf("follow %s: %v", services.OutcomeStream, err)
		}
		if got := view.Stats(seedType).Outcomes; !slices.ContainsFunc(got, func(o trust.Outcome) bool { return o.Key == "seed" }) {
			t.Fatalf("the view of %s has outcomes %+v, not the seed", services.OutcomeStream, got)
		}
		view.Stop()
	} else {
		c.denyPublish(t, "$JS.API.STREAM.INFO."+services.OutcomeStream)
	}
	m := seedOutcome(t, "smoke-"+c.user)
	if !slices.Contains(access.Publishes, services.OutcomeStream) {
		c.denyPublish(t, m.Subject)
		return
	}
	ack, err := c.js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatalf("publish %s: %v", m.Subject, err)
	}
	if ack.Stream != services.OutcomeStream {
		t.Fatalf("publish %s stored in %q, want %s", m.Subject, ack.Stream, services.OutcomeStream)
	}
}

// The gate user fetches and acks from its consumer, publishes admitted, is
// refused succeeded; it also uses its trust bucket with CAS and a watcher.
func testGate(ctx context.Context, t *testing.T, serverURL string, pw map[string]string, admin *conn) {
	ack, err := admin.js.Publish(ctx, events.TaskSubject("t1", events.StageVerified), []byte(`{"task":{"id":"t1"}}`))
	if err != nil {
		t.Fatal(err)
	}

	gate := connect(t, serverURL, "gate", pw["gate"], "_INBOX.gate")
	cons, err := gate.js.Consumer(ctx, services.Stream, services.ConsumerGate)
	if err != nil {
		t.Fatalf("gate binds its consumer: %v", err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatalf("gate fetches: %v", err)
	}
	var got int
	for msg := range batch.Messages() {
		got++
		if msg.Subject() != events.TaskSubject("t1", events.StageVerified) {
			t.Fatalf("gate got %s", msg.Subject())
		}
		// DoubleAck waits for the server's confirmation: the ack was allowed.
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatalf("gate acks: %v", err)
		}
	}
	if err := batch.Error(); err != nil || got != 1 {
		t.Fatalf("gate fetched %d messages (%v), want 1", got, err)
	}
	info, err := admin.js.Consumer(ctx, services.Stream, services.ConsumerGate)
	if err != nil {
		t.Fatal(err)
	}
	ci := info.CachedInfo()
	if ci.NumAckPending != 0 || ci.AckFloor.Stream < ack.Sequence {
		t.Fatalf("after the gate's ack: ack pending %d, ack floor %d; want 0 and %d", ci.NumAckPending, ci.AckFloor.Stream, ack.Sequence)
	}

	if _, err := gate.js.Publish(ctx, events.TaskSubject("t1", events.StageAdmitted), []byte(`{"task":{"id":"t1"}}`)); err != nil {
		t.Fatalf("gate publishes admitted: %v", err)
	}
	gate.denyPublish(t, events.TaskSubject("t1", events.StageSucceeded))
	gate.denyPublish(t, "$JS.ACK."+services.Stream+"."+services.ConsumerPrompt+".1.1.1.1.0")

	// Dead-letter path: read the original by sequence and by subject.
	stream, err := gate.js.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := stream.GetMsg(ctx, ack.Sequence); err != nil || m.Subject != events.TaskSubject("t1", events.StageVerified) {
		t.Fatalf("gate GetMsg(%d) = %v, %v", ack.Sequence, m, err)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, events.TaskSubject("t1", events.StageVerified)); err != nil {
		t.Fatalf("gate GetLastMsgForSubject: %v", err)
	}

	// Trust stats: create, compare-and-set, watch.
	trust, err := gate.js.KeyValue(ctx, services.BucketTrust)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := trust.Create(ctx, "css_fix", []byte(`{"outcomes":0}`))
	if err != nil {
		t.Fatalf("gate creates a trust key: %v", err)
	}
	if _, err := trust.Update(ctx, "css_fix", []byte(`{"outcomes":1}`), rev); err != nil {
		t.Fatalf("gate CAS-updates a trust key: %v", err)
	}
	if _, err := trust.Update(ctx, "css_fix", []byte(`{"outcomes":2}`), rev); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		t.Fatalf("stale CAS update: err = %v, want ErrKeyRevisionMismatch", err)
	}
	w, err := trust.Watch(ctx, "css_fix")
	if err != nil {
		t.Fatalf("gate watches a trust key: %v", err)
	}
	select {
	case e := <-w.Updates():
		if e == nil || string(e.Value()) != `{"outcomes":1}` {
			t.Fatalf("watch got %v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("gate's trust watcher got nothing")
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	gate.noViolations(t)
}

// The client reaches nothing of the mesh but through the API:
// no task state, no stream, no consumer (so no push consumer aimed at a
// service), no pipeline event.
func testClient(ctx context.Context, t *testing.T, serverURL string, pw map[string]string, admin *conn) {
	client := connect(t, serverURL, "client", pw["client"], "_INBOX.client")
	// Not even a submission: a JetStream publish's PubAck goes to the reply
	// the publisher names, unchecked. Clients submit through the API.
	client.denyPublish(t, events.SubmitSubject("css_fix"))
	client.denyPublish(t, events.TaskSubject("x", events.StageQueued))
	client.denyPublish(t, events.ReviewSubject(events.ReviewGated, "x"))
	client.denyPublish(t, events.IndexSubject("css_fix", "k"))

	// No direct read: task state, the stream, the outcomes, the history.
	for _, s := range []string{
		"$JS.API.STREAM.INFO.KV_" + services.BucketTasks,
		"$JS.API.DIRECT.GET.KV_" + services.BucketTasks + ".$KV." + services.BucketTasks + ".t1",
		"$JS.API.STREAM.MSG.GET.KV_" + services.BucketTasks,
		"$JS.API.STREAM.INFO." + services.Stream,
		"$JS.API.STREAM.MSG.GET." + services.Stream,
		"$JS.API.DIRECT.GET." + services.Stream,
		"$JS.API.STREAM.MSG.GET." + services.SubmitStream,
		"$JS.API.STREAM.INFO." + services.OutcomeStream,
		"$JS.API.STREAM.INFO.KV_" + services.BucketHistory,
		"$KV." + services.BucketTasks + ".t1",
		"$KV." + services.BucketTrust + ".css_fix",
		"$KV." + services.BucketPolicy + ".current",
		trust.OutcomeSubject(seedType),
	} {
		client.denyPublish(t, s)
	}

	// No consumer of any kind, on any stream: an ordered one, a push one
	// aimed at a service's subject, a stage's durable.
	gateCreate := "$JS.API.CONSUMER.CREATE." + services.Stream + "." + services.ConsumerGate
	for _, s := range []string{
		"$JS.API.CONSUMER.CREATE." + services.Stream + ".x",
		"$JS.API.CONSUMER.CREATE." + services.SubmitStream + ".x." + events.SubmitFilter,
		"$JS.API.CONSUMER.CREATE.KV_" + services.BucketPolicy + ".x",
		gateCreate,
		gateCreate + "." + events.StageFilter(events.StageVerified),
		"$JS.API.CONSUMER.MSG.NEXT." + services.Stream + "." + services.ConsumerGate,
		"$JS.API.CONSUMER.DELETE." + services.Stream + "." + services.ConsumerGate,
		"$JS.API.CONSUMER.DURABLE.CREATE." + services.Stream + "." + services.ConsumerGate,
		"$JS.API.CONSUMER.MSG.NEXT." + services.SubmitStream + "." + services.ConsumerIntake,
	} {
		client.denyPublish(t, s)
	}
	client.denySubscribe(t, "_INBOX.gate.>")
	client.denySubscribe(t, events.AllSubjects)

	info, err := admin.js.Consumer(ctx, services.Stream, services.ConsumerGate)
	if err != nil {
		t.Fatalf("gate consumer after the client's attempts: %v", err)
	}
	if f := info.CachedInfo().Config.FilterSubject; f != events.StageFilter(events.StageVerified) {
		t.Fatalf("gate consumer filter changed to %q", f)
	}
	client.noViolations(t)
}

// intake serves dispatch.api.submit (micro service "dispatch"); the client
// and admin get answers; a forged reply subject does not make intake publish
// where the client may not.
func testMicro(ctx context.Context, t *testing.T, serverURL string, pw map[string]string, admin *conn) {
	intake := connect(t, serverURL, "intake", pw["intake"], "_INBOX.intake")
	svc, err := micro.AddService(intake.nc, micro.Config{Name: services.MicroService, Version: "0.0.1"})
	if err != nil {
		t.Fatalf("intake adds micro service: %v", err)
	}
	defer svc.Stop()
	err = svc.AddEndpoint("submit", micro.HandlerFunc(func(r micro.Request) {
		_ = r.Respond([]byte(`{"accepted":true}`))
	}), micro.WithEndpointSubject(events.SubmitAPI))
	if err != nil {
		t.Fatalf("intake adds endpoint: %v", err)
	}
	// The round trip makes sure the server has the endpoint's subscription
	// before another connection sends the request.
	if err := intake.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	client := connect(t, serverURL, "client", pw["client"], "_INBOX.client")
	resp, err := client.nc.Request(events.SubmitAPI, []byte(`{"type":"css_fix","subject":"a.css"}`), 10*time.Second)
	if err != nil || string(resp.Data) != `{"accepted":true}` {
		t.Fatalf("client request %s: %v %v", events.SubmitAPI, resp, err)
	}
	// nats micro ls / stats as admin (default inbox).
	resp, err = admin.nc.Request("$SRV.PING."+services.MicroService, nil, 10*time.Second)
	if err != nil || !strings.Contains(string(resp.Data), `"name":"`+services.MicroService+`"`) {
		t.Fatalf("admin pings the micro service: %v %v", resp, err)
	}
	client.denyPublish(t, "$SRV.PING")

	// A request whose reply subject is a pipeline event: intake's answer is refused.
	forged := events.TaskSubject("t1", events.StageSucceeded)
	if err := client.nc.PublishRequest(events.SubmitAPI, forged, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	intake.waitViolation(t, "Publish", forged)
	if err := client.nc.PublishRequest(events.SubmitAPI, "_INBOX.gate.forged", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	intake.waitViolation(t, "Publish", "_INBOX.gate.forged")
	stream, err := admin.js.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, forged); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("forged reply reached the stream: %v", err)
	}
	intake.noViolations(t)
	client.noViolations(t)
}

// A message that exhausts its deliveries reaches the reaper through the
// advisory stream; the reaper reads the original and dead-letters it.
func testReaper(ctx context.Context, t *testing.T, serverURL string, pw map[string]string, admin *conn) {
	orig, err := admin.js.Publish(ctx, events.TaskSubject("p1", events.StagePrompted), []byte(`{"task":{"id":"p1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	executor := connect(t, serverURL, "executor", pw["executor"], "_INBOX.executor")
	cons, err := executor.js.Consumer(ctx, services.Stream, services.ConsumerExecutor)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if err := msg.Nak(); err != nil { // MaxDeliver 1: this was the last delivery
			t.Fatal(err)
		}
	}

	reaper := connect(t, serverURL, "reaper", pw["reaper"], "_INBOX.reaper")
	rc, err := reaper.js.Consumer(ctx, services.AdvisoryStream, services.ConsumerReaper)
	if err != nil {
		t.Fatalf("reaper binds its consumer: %v", err)
	}
	// The server emits the advisory when it next tries to deliver: keep the
	// executor pulling until the reaper has it.
	var advisory jetstream.Msg
	deadline := time.Now().Add(30 * time.Second)
	for advisory == nil && time.Now().Before(deadline) {
		eb, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for range eb.Messages() {
			t.Fatal("executor got the message again after MaxDeliver")
		}
		rb, err := rc.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range rb.Messages() {
			advisory = m
		}
	}
	if advisory == nil {
		t.Fatal("no max-deliveries advisory reached the reaper")
	}
	var adv struct {
		Stream    string `json:"stream"`
		Consumer  string `json:"consumer"`
		StreamSeq uint64 `json:"stream_seq"`
	}
	if err := json.Unmarshal(advisory.Data(), &adv); err != nil {
		t.Fatal(err)
	}
	if adv.Stream != services.Stream || adv.Consumer != services.ConsumerExecutor || adv.StreamSeq != orig.Sequence {
		t.Fatalf("advisory %+v, want %s/%s seq %d", adv, services.Stream, services.ConsumerExecutor, orig.Sequence)
	}
	stream, err := reaper.js.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		t.Fatalf("reaper reads the original: %v", err)
	}
	id, _, _ := events.ParseTaskSubject(m.Subject)
	if _, err := reaper.js.Publish(ctx, events.ReviewSubject(events.ReviewPoison, id), m.Data); err != nil {
		t.Fatalf("reaper dead-letters: %v", err)
	}
	if err := advisory.DoubleAck(ctx); err != nil {
		t.Fatalf("reaper acks: %v", err)
	}
	reaper.noViolations(t)
	executor.noViolations(t)
}

// The review page records decisions, requeues, updates task state by CAS,
// reads trust and lists review records; it cannot act as a stage.
func testWeb(ctx context.Context, t *testing.T, serverURL string, pw map[string]string) {
	web := connect(t, serverURL, "web", pw["web"], "_INBOX.web")
	for _, subj := range []string{
		events.ReviewSubject("action", "t1"),
		events.TaskSubject("t1", events.StageRetry),
		events.SubmitSubject("css_fix"),
	} {
		if _, err := web.js.Publish(ctx, subj, []byte(`{"by":"human"}`)); err != nil {
			t.Fatalf("web publishes %s: %v", subj, err)
		}
	}
	tasks, err := web.js.KeyValue(ctx, services.BucketTasks)
	if err != nil {
		t.Fatal(err)
	}
	e, err := tasks.Get(ctx, "seed")
	if err != nil {
		t.Fatalf("web reads task state: %v", err)
	}
	if _, err := tasks.Update(ctx, "seed", []byte(`{"status":"cancelled"}`), e.Revision()); err != nil {
		t.Fatalf("web CAS-updates task state: %v", err)
	}
	facts, err := web.js.KeyValue(ctx, services.BucketTrust)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := facts.Get(ctx, "seed"); err != nil {
		t.Fatalf("web reads the gate's facts: %v", err)
	}
	// The review client's trust: the outcomes followed, the facts watched.
	rc, err := review.New(review.Config{JS: web.js, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	tv, err := rc.TrustOf(ctx, seedType)
	if err != nil {
		rc.Close()
		t.Fatalf("web reads trust: %v", err)
	}
	// The held tasks of the review queue: a listing of the held index
	// (its keys — seed, the services' smoke tests — are no entries: read,
	// not listed).
	hl, err := rc.Held(ctx, "")
	// The page's live feed and search: one watch of the task bucket and a
	// follower of the answers, loaded to the bucket's current states.
	if err == nil {
		var l *review.Live
		if l, err = rc.Live(ctx); err == nil {
			err = l.Ready(ctx)
		}
		if err != nil {
			rc.Close()
			t.Fatalf("web follows the task bucket (the live feed): %v", err)
		}
	}
	rc.Close()
	if err != nil || hl.Scanned == 0 || hl.Total != 0 || !hl.Complete {
		t.Fatalf("web lists the held index: %+v, %v", hl, err)
	}
	if !slices.ContainsFunc(tv.Recent, func(o trust.Outcome) bool { return o.Key == "seed" }) {
		t.Fatalf("web's trust of %s: %+v, without the seed outcome", seedType, tv)
	}
	oc, err := web.js.OrderedConsumer(ctx, services.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.ReviewFilter},
	})
	if err != nil {
		t.Fatalf("web lists review records: %v", err)
	}
	batch, err := oc.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() {
	}
	if err := batch.Error(); err != nil {
		t.Fatal(err)
	}
	// The task explorer's probe: a consumer of the index from a sequence,
	// its NumPending read, then deleted.
	stream, err := web.js.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject: events.IndexFilterFor("css_fix", ""), AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 1,
	})
	if err != nil {
		t.Fatalf("web probes the task index: %v", err)
	}
	if err := stream.DeleteConsumer(ctx, probe.CachedInfo().Name); err != nil {
		t.Fatalf("web deletes its probe: %v", err)
	}
	web.denyPublish(t, events.IndexSubject("css_fix", "a.css"))
	web.denyPublish(t, events.TaskSubject("t1", events.StageAdmitted))
	web.denyPublish(t, events.ReviewSubject(events.ReviewEscalated, "t1"))
	web.denyPublish(t, "$KV."+services.BucketTrust+".css_fix")
	web.denyPublish(t, "$KV."+services.BucketHeld+".css_fix.0000000000000000001.t1.1")
	web.denyPublish(t, trust.OutcomeSubject(seedType))
	web.denyPublish(t, "$KV."+services.BucketHistory+".css_fix")
	web.denyPublish(t, "$JS.API.STREAM.INFO.KV_"+services.BucketHistory)
	web.denyPublish(t, "$JS.API.CONSUMER.MSG.NEXT."+services.Stream+"."+services.ConsumerRecorder)
	web.noViolations(t)
}

// Pins nats-io/nats-server#8274, documented in users.conf (CAUTION): a user
// who may create consumers can have the server deliver stored messages to a
// subject it may not publish to. The client may create none any more; web
// (and the auditor) still may, on DISPATCH. If this test fails because the
// server now refuses such a consumer, remove the CAUTION from users.conf and
// the docs, and this test.
func TestKnownIssueConsumerDeliverSubject(t *testing.T) {
	ns, pw := startSingle(t)
	ctx := testCtx(t)
	admin := connect(t, ns.ClientURL(), "admin", pw["admin"], "")
	provision(ctx, t, admin, 1)

	sub, err := admin.nc.SubscribeSync("tool.exec")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	web := connect(t, ns.ClientURL(), "web", pw["web"], "_INBOX.web")
	web.denyPublish(t, "tool.exec")
	_, err = web.js.CreateOrUpdateConsumer(ctx, services.Stream, jetstream.ConsumerConfig{
		DeliverSubject: "tool.exec",
		FilterSubject:  events.ReviewSubject(events.ReviewAction, "evil"),
		AckPolicy:      jetstream.AckNonePolicy,
	})
	if err != nil {
		t.Fatalf("the server refused a push consumer with a foreign deliver subject (%v): #8274 is fixed, update users.conf and the docs", err)
	}
	if _, err := web.js.Publish(ctx, events.ReviewSubject(events.ReviewAction, "evil"), []byte("rm -rf /")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(15 * time.Second)
	if err != nil {
		t.Fatalf("nothing delivered on tool.exec (%v): #8274 may be fixed, update users.conf and the docs", err)
	}
	if string(m.Data) != "rm -rf /" {
		t.Fatalf("delivered %q", m.Data)
	}
}

// ---------------------------------------------------------------------------
// (c) the cluster configs

func TestClusterConfigs(t *testing.T) {
	proctest.SetPasswords(t)
	names := map[string]bool{}
	var cluster string
	for i := 1; i <= 3; i++ {
		opts := proctest.ParseConf(t, filepath.Join("nats", "cluster", fmt.Sprintf("node-%d.conf", i)))
		if names[opts.ServerName] || opts.ServerName == "" {
			t.Fatalf("node-%d: server_name %q missing or not unique", i, opts.ServerName)
		}
		names[opts.ServerName] = true
		if opts.Cluster.Name == "" || (cluster != "" && opts.Cluster.Name != cluster) {
			t.Fatalf("node-%d: cluster name %q, others %q", i, opts.Cluster.Name, cluster)
		}
		cluster = opts.Cluster.Name
		if opts.Cluster.Port != 6222 || !opts.JetStream {
			t.Fatalf("node-%d: cluster port %d, JetStream %v", i, opts.Cluster.Port, opts.JetStream)
		}
	}
	for i := 1; i <= 3; i++ {
		opts := proctest.ParseConf(t, filepath.Join("nats", "cluster", fmt.Sprintf("node-%d.conf", i)))
		hosts := routeHosts(t, opts.Routes, 6222)
		for name := range names {
			if name != opts.ServerName && !slices.Contains(hosts, name) {
				t.Errorf("node-%d (%s): no route to %s (routes %v)", i, opts.ServerName, name, hosts)
			}
		}
	}

	// Kubernetes: server_name from POD_NAME, routes to every StatefulSet pod.
	t.Setenv("POD_NAME", "nats-1")
	opts := proctest.ParseConf(t, filepath.Join("k8s", "nats", "nats.conf"))
	if opts.ServerName != "nats-1" || opts.Cluster.Name != cluster {
		t.Fatalf("k8s nats.conf: server_name %q cluster %q", opts.ServerName, opts.Cluster.Name)
	}
	sts := readFile(t, filepath.Join("k8s", "nats.yaml"))
	replicas := regexp.MustCompile(`(?m)^  replicas: (\d+)$`).FindStringSubmatch(sts)
	svc := regexp.MustCompile(`(?m)^  serviceName: (\S+)$`).FindStringSubmatch(sts)
	if replicas == nil || replicas[1] != "3" || svc == nil {
		t.Fatalf("k8s/nats.yaml: StatefulSet replicas %v serviceName %v", replicas, svc)
	}
	hosts := routeHosts(t, opts.Routes, 6222)
	for i := 0; i < 3; i++ {
		if want := fmt.Sprintf("nats-%d.%s", i, svc[1]); !slices.Contains(hosts, want) {
			t.Errorf("k8s nats.conf: no route to %s (routes %v)", want, hosts)
		}
	}
}

func routeHosts(t *testing.T, routes []*url.URL, port int) []string {
	t.Helper()
	var hosts []string
	for _, r := range routes {
		if r.Port() != fmt.Sprint(port) {
			t.Errorf("route %s: port is not %d", r, port)
		}
		hosts = append(hosts, r.Hostname())
	}
	return hosts
}

// The three node configs, on loopback ports, form a JetStream cluster that
// holds an R3 stream and an R3 bucket, with the users of users.conf.
func TestClusterNodesFormJetStreamCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	pw := proctest.SetPasswords(t)
	// JetStream clustering needs configured routes at startup, so pick the
	// three route ports first and, like common.conf, give every node all three.
	// A port picked free may be taken by another test's process before a
	// node binds it (the packages run in parallel): then the three start
	// again on other ports.
	var nodes []*server.Server
	for try := 1; nodes == nil; try++ {
		routes := proctest.FreePorts(t, 3)
		for i := 1; i <= 3; i++ {
			opts := proctest.ClusterNode(t, "nats", i, -1, routes, t.TempDir())
			opts.AllowNonTLS = false // as common.conf says: TLS for clients, and for the routes
			ns, err := server.NewServer(opts)
			if err != nil {
				t.Fatalf("new server: %v", err)
			}
			ns.Start()
			nodes = append(nodes, ns)
			if !ns.ReadyForConnections(20 * time.Second) {
				for _, n := range nodes {
					n.Shutdown()
					n.WaitForShutdown()
				}
				if nodes = nil; try == 3 {
					t.Fatalf("node %d not ready on route ports %v, three times", i, routes)
				}
				break
			}
		}
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.Shutdown()
			n.WaitForShutdown()
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := connect(t, nodes[0].ClientURL(), "admin", pw["admin"], "")
	// The meta leader is elected once the routes are up: retry the first
	// stream creation until the cluster answers.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		_, err := admin.js.CreateStream(attempt, jetstream.StreamConfig{
			Name: services.Stream, Subjects: streamSubjects, Replicas: 3, AllowDirect: true,
		})
		cancelAttempt()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("R3 stream never created: %v", err)
		case <-tick.C:
		}
	}
	if _, err := admin.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: services.BucketTrust, Replicas: 3}); err != nil {
		t.Fatalf("R3 bucket: %v", err)
	}
	if _, err := admin.js.CreateOrUpdateConsumer(ctx, services.Stream, consumerConfigs()[services.ConsumerGate]); err != nil {
		t.Fatalf("gate consumer: %v", err)
	}

	// The gate, connected to another node, works as on a single server.
	gate := connect(t, nodes[2].ClientURL(), "gate", pw["gate"], "_INBOX.gate")
	ack, err := gate.js.Publish(ctx, events.TaskSubject("c1", events.StageAdmitted), []byte(`{}`))
	if err != nil {
		t.Fatalf("gate publishes through node 3: %v", err)
	}
	trust, err := gate.js.KeyValue(ctx, services.BucketTrust)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := trust.Put(ctx, "css_fix", []byte(`{}`)); err != nil {
		t.Fatalf("gate writes the R3 bucket: %v", err)
	}
	gate.denyPublish(t, events.TaskSubject("c1", events.StageSucceeded))
	gate.noViolations(t)

	// The account's limits, as common.conf sets them for three replicas.
	limits := readServerConf(t, filepath.Join("nats", "cluster", "node-1.conf"), 3).account
	t.Logf("account %s limits in force on the cluster %s", services.Stream, limitsReport("admin", checkLimitsInForce(ctx, t, admin.js, "admin", limits)))

	stream, err := admin.js.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	for {
		si, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		current := 0
		for _, r := range si.Cluster.Replicas {
			if r.Current {
				current++
			}
		}
		if si.Cluster.Name == "dispatch" && len(si.Cluster.Replicas) == 2 && current == 2 && si.State.LastSeq == ack.Sequence {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stream not replicated on 3 nodes: %+v", si.Cluster)
		case <-tick.C:
		}
	}
}

// ---------------------------------------------------------------------------
// container and Kubernetes manifests

// yamlDocs splits a YAML file into documents, each as its non-blank,
// non-comment lines.
func yamlDocs(text string) [][]string {
	var docs [][]string
	var cur []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimRight(line, " ") == "---" {
			docs = append(docs, cur)
			cur = nil
			continue
		}
		if trimmed := strings.TrimSpace(line); trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		cur = append(cur, line)
	}
	return append(docs, cur)
}

func yamlFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestYAMLFiles(t *testing.T) {
	files := yamlFiles(t)
	if len(files) < 10 {
		t.Fatalf("only %d YAML files: %v", len(files), files)
	}
	for _, f := range files {
		text := readFile(t, f)
		if strings.Contains(text, "\t") {
			t.Errorf("%s: tab characters", f)
		}
		var content int
		for i, doc := range yamlDocs(text) {
			if len(doc) == 0 {
				continue
			}
			content++
			if !strings.HasPrefix(filepath.ToSlash(f), "k8s/") {
				continue
			}
			var api, kind bool
			for _, line := range doc {
				api = api || strings.HasPrefix(line, "apiVersion: ")
				kind = kind || strings.HasPrefix(line, "kind: ")
			}
			if !api || !kind {
				t.Errorf("%s: document %d lacks apiVersion or kind", f, i+1)
			}
		}
		if content == 0 {
			t.Errorf("%s: empty", f)
		}
	}
}

// listItems returns the "- item" lines of the block that follows key.
func listItems(text, key string) []string {
	var items []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.TrimRight(line, " ") == key:
			in = true
		case in && strings.HasPrefix(trimmed, "- "):
			items = append(items, strings.TrimSpace(strings.TrimPrefix(trimmed, "- ")))
		case in && trimmed != "" && !strings.HasPrefix(trimmed, "#"):
			in = false
		}
	}
	return items
}

func TestKustomization(t *testing.T) {
	text := readFile(t, filepath.Join("k8s", "kustomization.yaml"))
	resources := listItems(text, "resources:")
	for _, r := range resources {
		if _, err := os.Stat(filepath.Join("k8s", r)); err != nil {
			t.Errorf("resource %s: %v", r, err)
		}
	}
	for _, f := range listItems(text, "    files:") {
		if _, err := os.Stat(filepath.Join("k8s", f)); err != nil {
			t.Errorf("configMapGenerator file %s: %v", f, err)
		}
	}
	entries, err := os.ReadDir("k8s")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".yaml") || name == "kustomization.yaml" {
			continue
		}
		listed := slices.Contains(resources, name)
		if strings.HasSuffix(name, ".template.yaml") {
			if listed {
				t.Errorf("%s is a template and must not be applied", name)
			}
		} else if !listed {
			t.Errorf("%s is not listed in kustomization.yaml", name)
		}
	}
}

func TestKubernetesDeployments(t *testing.T) {
	for _, name := range stageServices {
		t.Run(name, func(t *testing.T) {
			text := readFile(t, filepath.Join("k8s", name+".yaml"))
			for _, want := range []string{
				"kind: Deployment",
				`args: ["` + name + `"]`,
				"name: DISPATCH_NATS_USER\n              value: " + name + "\n",
				"key: " + proctest.PasswordVar(name) + "\n",
				"name: DISPATCH_METRICS_LISTEN",
				"readinessProbe:\n            httpGet:\n              path: /readyz\n",
				"livenessProbe:\n            httpGet:\n              path: /healthz\n",
				"terminationGracePeriodSeconds: 60",
				"resources:",
				"runAsNonRoot: true",
			} {
				if !strings.Contains(text, want) {
					t.Errorf("%s.yaml lacks %q", name, want)
				}
			}
			m := regexp.MustCompile(`(?m)^  replicas: (\d+)$`).FindStringSubmatch(text)
			switch {
			case m == nil || m[1] == "0":
				t.Errorf("%s.yaml: replicas %v", name, m)
			case name == services.ConsumerExecutor && m[1] != "2":
				t.Errorf("executor replicas %s, want 2", m[1])
			}
		})
	}
	job := readFile(t, filepath.Join("k8s", "provision-job.yaml"))
	for _, want := range []string{"value: admin", "key: " + proctest.PasswordVar("admin"), "name: DISPATCH_REPLICAS\n              value: \"3\""} {
		if !strings.Contains(job, want) {
			t.Errorf("provision-job.yaml lacks %q", want)
		}
	}
	js := configMapPolicy(t)
	if _, err := policy.Decode([]byte(js)); err != nil {
		t.Errorf("policy.json in the ConfigMap is not a policy the bucket takes: %v\n%s", err, js)
	}
	// The services read the policy from the bucket: only the provision Job
	// reads the file, to seed it.
	if !strings.Contains(job, "name: DISPATCH_POLICY_FILE") {
		t.Error("provision-job.yaml does not seed the policy bucket from the ConfigMap")
	}
	for _, name := range mesh.All {
		if strings.Contains(readFile(t, filepath.Join("k8s", name+".yaml")), "DISPATCH_POLICY_FILE") {
			t.Errorf("%s.yaml sets DISPATCH_POLICY_FILE, which services ignore (they read the bucket)", name)
		}
	}
}

// configMapPolicy is the policy.json of policy-configmap.yaml.
func configMapPolicy(t *testing.T) string {
	t.Helper()
	cm := readFile(t, filepath.Join("k8s", "policy-configmap.yaml"))
	_, body, ok := strings.Cut(cm, "  policy.json: |\n")
	if !ok {
		t.Fatal("policy-configmap.yaml has no policy.json")
	}
	var js strings.Builder
	for _, line := range strings.Split(body, "\n") {
		if line != "" && !strings.HasPrefix(line, "    ") {
			break
		}
		js.WriteString(strings.TrimPrefix(line, "    ") + "\n")
	}
	return js.String()
}

// Intake accepts only the types the policy names, in compose and in
// Kubernetes; so that compose runs the types its example submits, its
// provision seeds the bucket with the policy the ConfigMap holds.
func TestKnownTypesOnly(t *testing.T) {
	compose := readFile(t, filepath.Join("docker", "compose.yaml"))
	_, intakeBlock, _ := strings.Cut(compose, "\n  intake:\n")
	intakeBlock, _, _ = strings.Cut(intakeBlock, "\n\n")
	if !strings.Contains(intakeBlock, `DISPATCH_KNOWN_TYPES_ONLY: "true"`) {
		t.Errorf("compose.yaml: intake does not set DISPATCH_KNOWN_TYPES_ONLY: %s", intakeBlock)
	}
	if k8s := readFile(t, filepath.Join("k8s", "intake.yaml")); !strings.Contains(k8s, "- name: DISPATCH_KNOWN_TYPES_ONLY\n              value: \"true\"\n") {
		t.Error("k8s/intake.yaml does not set DISPATCH_KNOWN_TYPES_ONLY")
	}
	_, provisionBlock, _ := strings.Cut(compose, "\n  provision:\n")
	provisionBlock, _, _ = strings.Cut(provisionBlock, "\n\n")
	for _, want := range []string{"source: ./policy.json, target: /etc/dispatch/policy.json", "DISPATCH_POLICY_FILE: /etc/dispatch/policy.json"} {
		if !strings.Contains(provisionBlock, want) {
			t.Errorf("compose.yaml: provision lacks %q", want)
		}
	}
	seed, err := policy.Load(filepath.Join("docker", "policy.json"))
	if err != nil {
		t.Fatal(err)
	}
	cm, err := policy.Parse([]byte(configMapPolicy(t)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(seed, cm) {
		t.Errorf("docker/policy.json and the ConfigMap's policy.json differ:\n%+v\n%+v", seed, cm)
	}
	if !seed.Names("css_fix") {
		t.Error("docker/policy.json does not name css_fix, the type compose.yaml's example submits")
	}
}

// Every place that hands passwords to NATS or to a service names the same
// variables users.conf reads.
func TestPasswordVariablesAgree(t *testing.T) {
	var want []string
	for _, u := range proctest.Users {
		want = append(want, proctest.PasswordVar(u))
	}
	ref := regexp.MustCompile(`\$(NATS_PASSWORD_[A-Z0-9_]+)`)
	var got []string
	for _, line := range strings.Split(readFile(t, filepath.Join("nats", "users.conf")), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, m := range ref.FindAllStringSubmatch(line, -1) {
			got = append(got, m[1])
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("users.conf reads %v, want %v", got, want)
	}
	for _, f := range []string{
		filepath.Join("docker", "compose.yaml"),
		filepath.Join("docker", "compose.cluster.yaml"),
		filepath.Join("docker", "env.example"),
		filepath.Join("k8s", "secrets.template.yaml"),
	} {
		text := readFile(t, f)
		for _, v := range want {
			if !regexp.MustCompile(`(?m)^\s*` + v + `[:=]`).MatchString(text) {
				t.Errorf("%s does not set %s", f, v)
			}
		}
	}
}

func TestCompose(t *testing.T) {
	text := readFile(t, filepath.Join("docker", "compose.yaml"))
	var svcs []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case line == "services:":
			in = true
		case in && regexp.MustCompile(`^[a-z]`).MatchString(line):
			in = false
		case in && regexp.MustCompile(`^  [a-z][a-z0-9-]*:$`).MatchString(line):
			svcs = append(svcs, strings.TrimSuffix(strings.TrimSpace(line), ":"))
		}
	}
	for _, want := range append([]string{"nats", "provision"}, stageServices...) {
		if !slices.Contains(svcs, want) {
			t.Errorf("compose.yaml has no service %q (has %v)", want, svcs)
		}
	}
	for _, name := range stageServices {
		if !strings.Contains(text, `command: ["`+name+`"]`) || !strings.Contains(text, "DISPATCH_NATS_USER: "+name+"\n") {
			t.Errorf("compose.yaml: service %s does not run `dispatch %s` as user %s", name, name, name)
		}
	}
	for _, want := range []string{"/etc/nats/single.conf", "../nats:/etc/nats:ro", "stop_grace_period: 60s", "dockerfile: deploy/docker/Dockerfile"} {
		if !strings.Contains(text, want) {
			t.Errorf("compose.yaml lacks %q", want)
		}
	}
	cluster := readFile(t, filepath.Join("docker", "compose.cluster.yaml"))
	for i := 1; i <= 3; i++ {
		if !strings.Contains(cluster, fmt.Sprintf("/etc/nats/cluster/node-%d.conf", i)) || !strings.Contains(cluster, fmt.Sprintf("hostname: nats-%d\n", i)) {
			t.Errorf("compose.cluster.yaml: node %d missing", i)
		}
	}
}

func TestDockerfile(t *testing.T) {
	text := readFile(t, filepath.Join("docker", "Dockerfile"))
	for _, want := range []string{
		"FROM golang:1.26 AS build",
		"./cmd/dispatch",
		"CGO_ENABLED=0",
		"FROM gcr.io/distroless/static",
		"USER 65532:65532",
		"COPY --from=build",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join("docker", "Dockerfile.dockerignore")); err != nil {
		t.Error(err)
	}
}

// The key that seals a task's state goes to the services that seal it
// (intake, verifier, recorder) and to the executor that opens it, and to
// nobody else: the prompt builder, which may not write dispatch_tasks,
// could otherwise rewrite the state it relays; the gate needs none.
func TestStateKeyOnlyForStateWriters(t *testing.T) {
	holders := []string{services.ConsumerIntake, services.ConsumerVerifier, services.ConsumerExecutor, services.ConsumerRecorder}
	compose := readFile(t, filepath.Join("docker", "compose.yaml"))
	blocks := map[string]string{}
	name := ""
	for _, line := range strings.Split(compose, "\n") {
		if m := regexp.MustCompile(`^  ([a-z][a-z0-9-]*):$`).FindStringSubmatch(line); m != nil {
			name = m[1]
		} else if regexp.MustCompile(`^[a-z]`).MatchString(line) {
			name = ""
		}
		if name != "" {
			blocks[name] += line + "\n"
		}
	}
	for _, svc := range append(stageServices, "web", "provision") {
		want := slices.Contains(holders, svc)
		if got := strings.Contains(blocks[svc], "DISPATCH_STATE_KEY:"); got != want {
			t.Errorf("compose.yaml: service %s gets DISPATCH_STATE_KEY: %v, want %v", svc, got, want)
		}
		path := filepath.Join("k8s", svc+".yaml")
		if _, err := os.Stat(path); err != nil {
			continue
		}
		if got := strings.Contains(readFile(t, path), "name: DISPATCH_STATE_KEY"); got != want {
			t.Errorf("%s gets DISPATCH_STATE_KEY: %v, want %v", path, got, want)
		}
	}
	if strings.Contains(compose[:strings.Index(compose, "services:")], "DISPATCH_STATE_KEY") {
		t.Error("compose.yaml gives DISPATCH_STATE_KEY to every service (x-dispatch-env)")
	}
}

// The monitoring port has no authentication and its /connz lists every
// connection's subscriptions, the services' inboxes among them: a client
// must not reach it. Compose keeps it on the container's loopback (no port
// published; the health check runs inside), Kubernetes lets only the
// monitoring namespace's pods reach it (the kubelet's probes come from the
// node, which a NetworkPolicy never blocks).
func TestMonitoringPortGuarded(t *testing.T) {
	for _, f := range []string{"docker/compose.yaml", "docker/compose.cluster.yaml"} {
		if text := readFile(t, f); strings.Contains(text, ":8222\"") || strings.Contains(text, "- 8222") {
			t.Errorf("%s publishes the monitoring port", f)
		}
	}
	text := readFile(t, "k8s/nats.yaml")
	var policy string
	for _, doc := range strings.Split(text, "\n---\n") {
		if strings.Contains(doc, "kind: NetworkPolicy") {
			policy = doc
		}
	}
	ingress, ok := strings.CutPrefix(policy[strings.Index(policy, "  ingress:\n"):], "  ingress:\n")
	if policy == "" || !ok {
		t.Fatal("k8s/nats.yaml has no NetworkPolicy with ingress rules")
	}
	rules := strings.Split(ingress, "\n    - ")
	found := false
	for _, rule := range rules {
		if !strings.Contains(rule, "port: 8222") {
			continue
		}
		found = true
		if strings.Contains(rule, "port: 4222") || !strings.Contains(rule, "namespaceSelector:") ||
			!strings.Contains(rule, `dispatchmesh.io/monitoring: "true"`) {
			t.Errorf("the NetworkPolicy lets more than the monitoring namespace reach 8222:\n    - %s", rule)
		}
	}
	if !found {
		t.Error("the NetworkPolicy has no rule for 8222: the probes' port is either open to all or closed to Prometheus")
	}
}
