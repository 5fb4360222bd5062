package natstest

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Inboxes are the inbox subjects (no wildcard) nc subscribes to, as the
// server's monitoring shows them to anyone who may read it (/connz?subs=1):
// where a watcher of nc takes its deliveries.
func (s *Server) Inboxes(t testing.TB, nc *nats.Conn) []string {
	t.Helper()
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatalf("client id: %v", err)
	}
	if err := nc.Flush(); err != nil { // its subscriptions have reached the server
		t.Fatalf("flush: %v", err)
	}
	cz, err := s.Connz(&server.ConnzOptions{Subscriptions: true, CID: cid})
	if err != nil {
		t.Fatalf("connz: %v", err)
	}
	var inboxes []string
	for _, c := range cz.Conns {
		for _, sub := range c.Subs {
			if strings.HasPrefix(sub, "_INBOX.") && !strings.ContainsAny(sub, "*>") {
				inboxes = append(inboxes, sub)
			}
		}
	}
	return inboxes
}

var forgedStreams atomic.Int64

// ForgedStream creates a stream of its own holding msgs under their very
// subjects — those of another stream or of a KV bucket too: it sources
// them, with a subject transform each, from a stream where they were
// published under subjects of its own — its first sequence far past
// anything the test stores, and returns its name. What a hostile user who
// may create streams keeps to feed others.
func ForgedStream(t testing.TB, js jetstream.JetStream, msgs ...*nats.Msg) string {
	t.Helper()
	ctx := t.Context()
	name := fmt.Sprintf("FORGED_%d", forgedStreams.Add(1))
	prefix := strings.ToLower(name) + "."
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + "_SRC", Subjects: []string{prefix + ">"}}); err != nil {
		t.Fatalf("create %s_SRC: %v", name, err)
	}
	source := &jetstream.StreamSource{Name: name + "_SRC"}
	for i, m := range msgs {
		own := nats.NewMsg(fmt.Sprintf("%s%d", prefix, i))
		own.Header, own.Data = m.Header, m.Data
		if _, err := js.PublishMsg(ctx, own); err != nil {
			t.Fatalf("publish to %s_SRC: %v", name, err)
		}
		source.SubjectTransforms = append(source.SubjectTransforms, jetstream.SubjectTransformConfig{Source: own.Subject, Destination: m.Subject})
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Sources: []*jetstream.StreamSource{source}, FirstSeq: 100_000})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if info.State.Msgs == uint64(len(msgs)) {
			return name
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d messages, want %d", name, info.State.Msgs, len(msgs))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Deliver creates a push consumer on stream that delivers its messages
// from sequence from (0: all) to deliverTo — the delivery any user who may
// create a consumer can make to any subject (nats-io/nats-server#8274).
func Deliver(t testing.TB, js jetstream.JetStream, stream string, from uint64, deliverTo string) {
	t.Helper()
	cfg := jetstream.ConsumerConfig{DeliverSubject: deliverTo, AckPolicy: jetstream.AckNonePolicy}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	if _, err := js.CreatePushConsumer(t.Context(), stream, cfg); err != nil {
		t.Fatalf("push consumer on %s delivering to %s: %v", stream, deliverTo, err)
	}
}
