package mesh_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/natsperm"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// authServer runs JetStream with user "admin" (everything) and one user per
// entry of perms, password "pw".
func authServer(t *testing.T, perms map[string]*server.Permissions) *server.Server {
	t.Helper()
	users := []*server.User{{Username: "admin", Password: "pw"}}
	for name, p := range perms {
		users = append(users, &server.User{Username: name, Password: "pw", Permissions: p})
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true, Users: users,
	})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	return ns
}

func connectAs(t *testing.T, ns *server.Server, user string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(user, "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// allBut may do everything except use the buckets not in a (and write
// those a only reads).
func allBut(a mesh.Access) *server.Permissions {
	var deny []string
	for _, b := range services.AllBuckets {
		if !slices.Contains(a.All(), b) {
			deny = append(deny, "$JS.API.*.*.KV_"+b, "$JS.API.*.*.KV_"+b+".>", "$JS.API.STREAM.MSG.GET.KV_"+b)
		}
		if !slices.Contains(a.Writes, b) {
			deny = append(deny, "$KV."+b+".>")
		}
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
		Subscribe: &server.SubjectPermission{Allow: []string{">"}},
	}
}

func provisionAsAdmin(t *testing.T, ns *server.Server) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(connectAs(t, ns, "admin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := services.Provision(context.Background(), js, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	return js
}

func runAs(ctx context.Context, nc *nats.Conn, service string) error {
	return runLogged(ctx, nc, service, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func runLogged(ctx context.Context, nc *nats.Conn, service string, log *slog.Logger) error {
	return mesh.Run(ctx, mesh.Options{NC: nc, Services: []string{service}, Log: log})
}

// started signals when the router logs that a service consumes.
type started chan struct{}

func (s started) Enabled(context.Context, slog.Level) bool { return true }
func (s started) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s started) WithGroup(string) slog.Handler            { return s }
func (s started) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "service started" {
		select {
		case s <- struct{}{}:
		default:
		}
	}
	return nil
}

// Every service starts as a user who may use only the buckets mesh.Buckets
// lists for it: it binds nothing else.
func TestEachServiceBindsOnlyItsBuckets(t *testing.T) {
	perms := map[string]*server.Permissions{}
	for _, name := range mesh.All {
		perms[name] = allBut(mesh.Buckets[name])
	}
	ns := authServer(t, perms)
	provisionAsAdmin(t, ns)
	for _, name := range mesh.All {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			up := make(started, 1)
			done := make(chan error, 1)
			nc := connectAs(t, ns, name)
			go func() { done <- runLogged(ctx, nc, name, slog.New(up)) }()
			select {
			case <-up:
			case err := <-done:
				t.Fatalf("%s did not start: %v", name, err)
			case <-time.After(patience):
				t.Fatalf("%s never started", name)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("%s stopped with %v", name, err)
			}
		})
	}
}

// A service whose user may not use one of its buckets fails to start with
// the refusal, not a timeout and not advice to provision.
func TestStartNamesTheRefusal(t *testing.T) {
	ns := authServer(t, map[string]*server.Permissions{
		"gate":   allBut(mesh.Access{Writes: []string{services.BucketTasks}}),
		"intake": {Subscribe: &server.SubjectPermission{Deny: []string{"dispatch.api.status"}}},
	})
	provisionAsAdmin(t, ns)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second) // how long the refused call waits
	defer cancel()
	err := runAs(ctx, connectAs(t, ns, "gate"), mesh.Gate)
	want := `permission denied for $JS.API.STREAM.INFO.KV_dispatch_trust: NATS user "gate" may not use bucket dispatch_trust`
	var perr *natsperm.Error
	if !errors.As(err, &perr) || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "provision") {
		t.Fatalf("gate without its trust bucket: %v\nwant %s", err, want)
	}

	err = runAs(context.Background(), connectAs(t, ns, "intake"), mesh.Intake)
	want = `micro api: permission denied for dispatch.api.status: NATS user "intake" may not subscribe to it`
	if !errors.As(err, &perr) || err.Error() != want {
		t.Fatalf("intake without its status endpoint: %v\nwant %s", err, want)
	}
}

// Before provisioning the advice is to provision.
func TestStartBeforeProvisioning(t *testing.T) {
	ns := authServer(t, nil)
	err := runAs(context.Background(), connectAs(t, ns, "admin"), mesh.Gate)
	if !errors.Is(err, jetstream.ErrBucketNotFound) || !strings.Contains(err.Error(), "run `dispatch provision`") {
		t.Fatalf("gate before provisioning: %v", err)
	}
}

// The gate and the recorder of one process read the trust outcomes
// through one View: each outcome is delivered to the process, decoded and
// folded once (one consumer on the outcome stream, not one per service).
func TestServicesOfOneProcessShareTheirView(t *testing.T) {
	srv := startMesh(t, nil)
	done := countOn(t, srv.NC, events.StageFilter(events.StageSucceeded))
	if _, err := srv.JS.Publish(context.Background(), events.SubmitSubject("css_fix"),
		[]byte(`{"id":"v1","subject":"src/app.css","payload":{"issue":"x"}}`)); err != nil {
		t.Fatal(err)
	}
	done.wait(t, 1) // the gate and the recorder are both up
	stream, err := srv.JS.Stream(context.Background(), services.OutcomeStream)
	if err != nil {
		t.Fatal(err)
	}
	// An ordered consumer that was recreated leaves the old one until the
	// server removes it: wait for the count to settle, not for luck.
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := stream.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Consumers == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the outcome stream has %d consumers, want 1: one View for the process", info.State.Consumers)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
