// Package natstest starts a real embedded NATS JetStream server for tests:
// random port, temporary store directory, shut down by t.Cleanup. Only tests
// import it.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is a running embedded server and a client connected to it.
type Server struct {
	*server.Server
	NC *nats.Conn
	JS jetstream.JetStream
}

// URL is the client URL of the server.
func (s *Server) URL() string { return s.ClientURL() }

// Connect opens another client connection, closed at cleanup.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// Start runs a JetStream server on a random port with its store in a temp dir.
func Start(t testing.TB) *Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		ServerName: "test",
		Host:       "127.0.0.1",
		Port:       -1,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	s := &Server{Server: ns}
	s.NC, s.JS = s.Connect(t)
	return s
}
