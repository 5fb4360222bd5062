package services_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Provision bounds what clients fill: each stream's bytes (refusing new
// messages past them, never dropping stored ones) and message size, and every bucket keyed by what a
// client chose expires a key left unwritten for the audit horizon.
func TestProvisionBoundsWhatClientsFill(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	const age = 48 * time.Hour
	if _, err := services.Provision(ctx, srv.JS, services.StreamConfig{MaxAge: age, MaxBytes: 64 << 20, SubmitMaxBytes: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	for name, bytes := range map[string]int64{services.Stream: 64 << 20, services.SubmitStream: 16 << 20} {
		s, err := srv.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		if c.MaxBytes != bytes || c.MaxMsgSize != services.MaxEventSize || c.Discard != jetstream.DiscardNew {
			t.Errorf("%s: max bytes %d, max message %d, %s", name, c.MaxBytes, c.MaxMsgSize, c.Discard)
		}
	}
	for _, bucket := range []string{services.BucketTasks, services.BucketTrust, services.BucketHistory} {
		kv, err := srv.JS.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.TTL() != age {
			t.Errorf("%s keeps an unwritten key %s, want %s", bucket, st.TTL(), age)
		}
	}
	outcomes, err := srv.JS.Stream(ctx, services.OutcomeStream)
	if err != nil {
		t.Fatal(err)
	}
	if c := outcomes.CachedInfo().Config; c.MaxAge != age {
		t.Errorf("%s keeps outcomes %s, want %s", services.OutcomeStream, c.MaxAge, age)
	}
	// Unset, the streams are unbounded, as before.
	if _, err := services.Provision(ctx, srv.JS, services.StreamConfig{MaxAge: age}); err != nil {
		t.Fatal(err)
	}
	s, err := srv.JS.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxBytes != -1 {
		t.Errorf("unset: max bytes %d", c.MaxBytes)
	}
}

// Provisioning what is there already changes nothing on the server: no
// stream or bucket is updated (every service start provisions). A changed
// setting is still applied.
func TestProvisionUpdatesOnlyWhatChanged(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	cfg := services.StreamConfig{MaxAge: 48 * time.Hour}
	if _, err := services.Provision(ctx, srv.JS, cfg); err != nil {
		t.Fatal(err)
	}
	advisories := make(chan string, 256)
	sub, err := srv.NC.Subscribe("$JS.EVENT.ADVISORY.STREAM.>", func(m *nats.Msg) { advisories <- m.Subject })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := srv.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	// until reads the advisories up to want's, and returns the streams
	// updated before it. The server sends them in the order it handled
	// the requests.
	until := func(want string) []string {
		t.Helper()
		var updated []string
		for {
			select {
			case subject := <-advisories:
				if subject == want {
					return updated
				}
				if name, ok := strings.CutPrefix(subject, "$JS.EVENT.ADVISORY.STREAM.UPDATED."); ok {
					updated = append(updated, name)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no advisory %s", want)
			}
		}
	}
	if _, err := services.Provision(ctx, srv.JS, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "MARK", Subjects: []string{"mark"}}); err != nil {
		t.Fatal(err)
	}
	if updated := until("$JS.EVENT.ADVISORY.STREAM.CREATED.MARK"); len(updated) != 0 {
		t.Fatalf("provisioning again what is there updated %v", updated)
	}
	cfg.MaxBytes = 64 << 20 // the task events' stream only
	if _, err := services.Provision(ctx, srv.JS, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "MARK2", Subjects: []string{"mark2"}}); err != nil {
		t.Fatal(err)
	}
	if updated := until("$JS.EVENT.ADVISORY.STREAM.CREATED.MARK2"); !slices.Equal(updated, []string{services.Stream}) {
		t.Fatalf("a changed size updated %v, want only %s", updated, services.Stream)
	}
	s, err := srv.JS.Stream(ctx, services.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxBytes != cfg.MaxBytes {
		t.Fatalf("%s: max bytes %d, want %d", services.Stream, c.MaxBytes, cfg.MaxBytes)
	}
}
