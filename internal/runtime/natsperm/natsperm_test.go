package natsperm_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/natsperm"
)

// startServer runs a JetStream server with user "gate", who may publish
// only on allowed.> and subscribe only to its replies, and "admin".
func startServer(t *testing.T) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
		Users: []*server.User{
			{Username: "admin", Password: "a"},
			{Username: "gate", Password: "g", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"allowed.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		},
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

func connect(t *testing.T, ns *server.Server, user, pass string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(user, pass))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// A refused KV bind times out; Explain names the refused subject, the user
// and the bucket, and keeps both causes for errors.Is.
func TestExplainRefusedBind(t *testing.T) {
	ns := startServer(t)
	admin, _ := jetstream.New(connect(t, ns, "admin", "a"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "dispatch_trust"}); err != nil {
		t.Fatal(err)
	}

	nc := connect(t, ns, "gate", "g")
	js, _ := jetstream.New(nc)
	bctx, bcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer bcancel()
	_, err := js.KeyValue(bctx, "dispatch_trust")
	if err == nil {
		t.Fatal("gate bound a bucket it may not use")
	}
	err = natsperm.Explain(nc, err)
	want := `permission denied for $JS.API.STREAM.INFO.KV_dispatch_trust: NATS user "gate" may not use bucket dispatch_trust (context deadline exceeded)`
	if err.Error() != want {
		t.Fatalf("explained as\n  %v\nwant\n  %s", err, want)
	}
	var perr *natsperm.Error
	if !errors.As(err, &perr) || perr.Op != "publish" || !errors.Is(err, nats.ErrPermissionViolation) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("not a permission error wrapping both causes: %#v", err)
	}
}

// A refused subscription (with a queue group, as micro endpoints use) is
// found by Last after a round trip.
func TestLastRefusedSubscription(t *testing.T) {
	ns := startServer(t)
	nc := connect(t, ns, "gate", "g")
	if natsperm.Last(nc) != nil {
		t.Fatal("a fresh connection has a refusal")
	}
	if _, err := nc.QueueSubscribe("dispatch.api.status", "q", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	e := natsperm.Last(nc)
	if e == nil || e.Op != "subscribe" || e.Subject != "dispatch.api.status" || e.User != "gate" {
		t.Fatalf("Last = %#v", e)
	}
	if want := `permission denied for dispatch.api.status: NATS user "gate" may not subscribe to it`; e.Error() != want {
		t.Fatalf("%q, want %q", e.Error(), want)
	}
}

// Explain leaves alone what is no timeout or has no refusal behind it.
func TestExplainLeavesOtherErrors(t *testing.T) {
	ns := startServer(t)
	nc := connect(t, ns, "gate", "g")
	if err := natsperm.Explain(nc, context.DeadlineExceeded); err != context.DeadlineExceeded {
		t.Fatalf("a timeout without a refusal became %v", err)
	}
	if err := nc.Publish("forbidden", nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := natsperm.Explain(nc, jetstream.ErrBucketNotFound); err != jetstream.ErrBucketNotFound {
		t.Fatalf("a missing bucket became %v", err)
	}
	if err := natsperm.Explain(nc, nil); err != nil {
		t.Fatalf("nil became %v", err)
	}
}

func TestErrorSaysWhatTheSubjectWasFor(t *testing.T) {
	for subject, want := range map[string]string{
		"$KV.dispatch_history.k":                           "write to bucket dispatch_history",
		"$JS.API.DIRECT.GET.KV_dispatch_tasks.$KV.x":       "use bucket dispatch_tasks",
		"$JS.FC.KV_dispatch_trust.abc":                     "use bucket dispatch_trust",
		"$JS.API.CONSUMER.CREATE.DISPATCH.gate.dispatch.>": "use consumer gate on stream DISPATCH",
		"$JS.API.CONSUMER.MSG.NEXT.DISPATCH.prompt":        "use consumer prompt on stream DISPATCH",
		"$JS.API.CONSUMER.DURABLE.CREATE.DISPATCH.gate":    "use consumer gate on stream DISPATCH",
		"$JS.ACK.DISPATCH.gate.1.2.3.4.5.6":                "acknowledge messages of consumer gate on stream DISPATCH",
		"$JS.API.STREAM.DELETE.DISPATCH":                   "use this JetStream API",
		"dispatch.submit.x":                                "publish to it",
	} {
		e := &natsperm.Error{User: "gate", Op: "publish", Subject: subject}
		if got, w := e.Error(), `permission denied for `+subject+`: NATS user "gate" may not `+want; got != w {
			t.Errorf("got  %s\nwant %s", got, w)
		}
	}
}
