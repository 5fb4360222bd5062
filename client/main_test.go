package client_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// meshURL is a whole mesh — embedded JetStream, every service, the
// simulated model — shared by the tests and examples of this package.
var meshURL string

// slowVerifier is the verifier of type "slow": a task of that type waits
// at the verifier until a test answers it.
const slowVerifier = "verify.client_test.slow"

var testPolicy = &policy.File{Types: map[string]policy.Type{
	"slow": {Verifier: &policy.Verifier{Kind: policy.VerifierNATS, Subject: slowVerifier, Timeout: policy.Duration(time.Minute)}},
}}

func TestMain(m *testing.M) {
	code, err := runWithMesh(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(code)
}

func runWithMesh(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "client-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		return 0, err
	}
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		return 0, fmt.Errorf("nats server not ready")
	}
	meshURL = ns.ClientURL()
	nc, err := nats.Connect(meshURL)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- mesh.Run(ctx, mesh.Options{NC: nc, Provision: true, Policy: policy.Static(testPolicy),
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Grace: time.Second})
	}()
	// Ready once the micro service answers and every consumer exists.
	deadline := time.Now().Add(time.Minute)
	for !ready(ctx, nc) {
		select {
		case err := <-done:
			cancel()
			return 0, fmt.Errorf("mesh stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			return 0, fmt.Errorf("the mesh never came up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		return 0, fmt.Errorf("mesh stopped with %v", err)
	}
	return code, nil
}

func ready(ctx context.Context, nc *nats.Conn) bool {
	if _, err := nc.Request("$SRV.PING.dispatch", nil, time.Second); err != nil {
		return false
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	for _, name := range mesh.All {
		if _, err := js.Consumer(ctx, services.StreamOf(name), name); err != nil {
			return false
		}
	}
	return true
}
