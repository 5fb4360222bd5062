package directget_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/internal/directget"
	"dispatchmesh/internal/natstest"
)

func setup(t *testing.T) (*directget.Getter, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Start(t)
	_, err := srv.JS.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "S", Subjects: []string{"s.>"}, MaxMsgsPerSubject: 3, AllowDirect: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	g := directget.New(srv.NC)
	t.Cleanup(func() { _ = g.Close() })
	return g, srv.JS
}

func pub(t *testing.T, js jetstream.JetStream, subject, data string) {
	t.Helper()
	if _, err := js.Publish(context.Background(), subject, []byte(data)); err != nil {
		t.Fatal(err)
	}
}

func bodies(msgs []directget.Msg) []string {
	var b []string
	for _, m := range msgs {
		b = append(b, string(m.Data))
	}
	return b
}

func TestSubject(t *testing.T) {
	g, js := setup(t)
	ctx := t.Context()
	if msgs, err := g.Subject(ctx, "S", "s.a.*", 10); err != nil || len(msgs) != 0 {
		t.Fatalf("empty stream: %v %v", msgs, err)
	}
	for i := range 5 {
		pub(t, js, "s.a.x", fmt.Sprint("x", i))
		pub(t, js, "s.b.x", fmt.Sprint("other", i))
	}
	pub(t, js, "s.a.y", "y0")
	msgs, err := g.Subject(ctx, "S", "s.a.x", 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(bodies(msgs)); got != "[x2 x3 x4]" { // the stream keeps 3 per subject
		t.Errorf("s.a.x = %s", got)
	}
	if msgs[0].Subject != "s.a.x" || msgs[0].Sequence == 0 || msgs[0].Sequence >= msgs[1].Sequence {
		t.Errorf("first message: %+v", msgs[0])
	}
	msgs, err = g.Subject(ctx, "S", "s.a.*", 10)
	if err != nil || fmt.Sprint(bodies(msgs)) != "[x2 x3 x4 y0]" {
		t.Errorf("s.a.* = %v, %v", bodies(msgs), err)
	}
	msgs, err = g.Subject(ctx, "S", "s.a.*", 2)
	if err != nil || fmt.Sprint(bodies(msgs)) != "[x2 x3]" {
		t.Errorf("s.a.* at most 2 = %v, %v", bodies(msgs), err)
	}
	if _, err := g.Subject(ctx, "S", "s.a.x", 0); err == nil {
		t.Error("a batch of 0 was asked")
	}
}

func TestNoStream(t *testing.T) {
	g, _ := setup(t)
	if _, err := g.Subject(t.Context(), "MISSING", "s.>", 5); !errors.Is(err, directget.ErrNoStream) {
		t.Errorf("err = %v, want ErrNoStream", err)
	}
}

// Requests in flight at once on one Getter each get their own answers.
func TestConcurrent(t *testing.T) {
	g, js := setup(t)
	for i := range 20 {
		pub(t, js, fmt.Sprintf("s.k%d", i), fmt.Sprint(i))
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			for range 20 {
				msgs, err := g.Subject(context.Background(), "S", fmt.Sprintf("s.k%d", i), 3)
				if err != nil || len(msgs) != 1 || string(msgs[0].Data) != fmt.Sprint(i) {
					t.Errorf("s.k%d = %v, %v", i, bodies(msgs), err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestCancelled(t *testing.T) {
	g, _ := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := g.Subject(ctx, "S", "s.>", 5); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}
