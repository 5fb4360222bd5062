package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// patience bounds every wait: a deadlock guard, not a timing assertion.
const patience = time.Minute

// uid is a task id no other run of a test used: the mesh outlives -count.
func uid(prefix string) string { return prefix + "-" + nuid.Next() }

func connect(t *testing.T) (*nats.Conn, *client.Client) {
	t.Helper()
	nc, err := nats.Connect(meshURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, c
}

func TestSubmitWaitStatus(t *testing.T) {
	_, c := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	id := uid("c")
	task := client.Task{ID: id, Type: "css_fix", Subject: "src/app.css", Payload: json.RawMessage(`{"issue":"button misaligned"}`)}
	sub, err := c.Submit(ctx, task)
	if err != nil || sub.ID != id || sub.Duplicate {
		t.Fatalf("Submit: %+v, %v", sub, err)
	}
	out, err := c.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if out.Status != events.StatusSucceeded || !out.Terminal || out.TimedOut || out.Attempts != 1 || out.Result == nil ||
		!out.Result.Simulated || !strings.HasPrefix(out.Result.Summary, "SIMULATED") || out.TokensIn == 0 {
		t.Fatalf("Wait: %+v (result %+v)", out, out.Result)
	}
	// The same id again: idempotent.
	if again, err := c.Submit(ctx, task); err != nil || again.ID != id || !again.Duplicate {
		t.Fatalf("second Submit: %+v, %v", again, err)
	}
	st, err := c.Status(ctx, id)
	if err != nil || st.Status != events.StatusSucceeded || len(st.History) != 1 {
		t.Fatalf("Status: %+v, %v", st, err)
	}
	// Without an id, one is generated: the answer says which.
	gen, err := c.Submit(ctx, client.Task{Type: "css_fix", Subject: "src/other.css"})
	if err != nil || !events.ValidID(gen.ID) {
		t.Fatalf("Submit without id: %+v, %v", gen, err)
	}
}

// An invalid task is refused before anything is sent, with every problem.
func TestSubmitInvalid(t *testing.T) {
	_, c := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for _, c2 := range []struct {
		task     client.Task
		problems []string
	}{
		{client.Task{Type: "CSS fix"}, []string{`"type" "CSS fix" must be 1-64 characters of a-z, 0-9, _ or -`, `"subject" is required`}},
		{client.Task{Type: "css_fix", Subject: "s", Payload: json.RawMessage(`{`)}, []string{`"payload" is not valid JSON`}},
		{client.Task{ID: "a.b", Type: "css_fix", Subject: "s"}, []string{`"id" "a.b" must be 1-128 characters of A-Z, a-z, 0-9, _ or -`}},
	} {
		_, err := c.Submit(ctx, c2.task)
		var e *client.Error
		if !errors.As(err, &e) || !errors.Is(err, client.ErrInvalid) || e.Code != 400 || !slices.Equal(e.Problems, c2.problems) {
			t.Errorf("Submit(%+v) = %v (%+v), want problems %q", c2.task, err, e, c2.problems)
		}
	}
}

// A task published with a bad body is rejected by intake: Wait and Status
// say so, with the problems.
func TestWaitRejected(t *testing.T) {
	nc, c := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	js, _ := jetstream.New(nc)
	bad := uid("c-bad")
	if _, err := js.Publish(ctx, "dispatch.submit.css_fix", []byte(`{"id":"`+bad+`","max_retries":-2}`)); err != nil {
		t.Fatal(err)
	}
	want := []string{`"subject" is required`, `"max_retries" must not be negative`}
	_, err := c.Wait(ctx, bad)
	var e *client.Error
	if !errors.As(err, &e) || !errors.Is(err, client.ErrRejected) || !slices.Equal(e.Problems, want) {
		t.Fatalf("Wait: %v (%+v)", err, e)
	}
	if _, err := c.Status(ctx, bad); !errors.Is(err, client.ErrRejected) {
		t.Fatalf("Status: %v", err)
	}
	if _, err := c.Status(ctx, "c-nobody"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Status of an unknown id: %v", err)
	}
	if _, err := c.Status(ctx, "a b"); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Status of an invalid id: %v", err)
	}
}

// When ctx ends first, Wait says where the task stands; the task goes on.
func TestWaitGivesUp(t *testing.T) {
	nc, c := connect(t)
	verify := make(chan *nats.Msg, 1)
	sub, err := nc.ChanSubscribe(slowVerifier, verify)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	slow := uid("c-slow")
	if _, err := c.Submit(ctx, client.Task{ID: slow, Type: "slow", Subject: "s"}); err != nil {
		t.Fatal(err)
	}
	var held *nats.Msg
	select {
	case held = <-verify: // the task waits at its verifier
	case <-ctx.Done():
		t.Fatal("the verifier was never asked")
	}
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	out, err := c.Wait(short, slow)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) || !out.TimedOut || out.Status != events.StatusVerifying || out.Stage != events.StageQueued {
		t.Fatalf("Wait: %+v, %v", out, err)
	}
	if !strings.Contains(err.Error(), "still verifying (stage queued)") {
		t.Fatalf("error %q does not say where the task is", err)
	}
	if err := held.Respond([]byte(`{"exists":true,"detail":"still broken"}`)); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Wait(ctx, slow); err != nil || out.Status != events.StatusSucceeded {
		t.Fatalf("Wait after the verifier answered: %+v, %v", out, err)
	}
}

// Watch delivers the task's stage events in order.
func TestWatch(t *testing.T) {
	_, c := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	id := uid("c-watch")
	if _, err := c.Submit(ctx, client.Task{ID: id, Type: "css_fix", Subject: "src/app.css"}); err != nil {
		t.Fatal(err)
	}
	var stages []string
	err := c.Watch(ctx, id, func(e client.Event) bool {
		stages = append(stages, e.Stage)
		final, _ := e.Final()
		return !final
	})
	// css_fix has no verifier: intake sends the task to the gate at once.
	want := []string{events.StageVerified, events.StageAdmitted, events.StagePrompted, events.StageExecuted, events.StageSucceeded}
	if err != nil || !slices.Equal(stages, want) {
		t.Fatalf("Watch: %v, %v; want %v", stages, err, want)
	}
	if err := c.Watch(ctx, "a.b", func(client.Event) bool { return false }); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Watch of an invalid id: %v", err)
	}
}

// Without a mesh, the error says so.
func TestNoMesh(t *testing.T) {
	srv := natstest.Start(t) // a NATS server, no mesh
	c, err := client.New(srv.NC)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	short, cancelShort := context.WithTimeout(ctx, time.Second) // it asks until then
	_, err = c.Submit(short, client.Task{Type: "css_fix", Subject: "s"})
	cancelShort()
	if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "is the mesh up") {
		t.Fatalf("Submit without a mesh: %v", err)
	}
	if _, err := client.New(nil); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("New(nil): %v", err)
	}
	if _, err := client.New(srv.NC, client.WithRequestTimeout(0)); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("WithRequestTimeout(0): %v", err)
	}
}

// A submit sent while the mesh starts is answered once it is up.
func TestSubmitWhileTheMeshStarts(t *testing.T) {
	srv := natstest.Start(t)
	c, err := client.New(srv.NC)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		_, err := c.Submit(ctx, client.Task{Type: "css_fix", Subject: "s"})
		answered <- err
	}()
	nc, _ := srv.Connect(t)
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- mesh.Run(mctx, mesh.Options{NC: nc, Provision: true, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Grace: time.Second})
	}()
	if err := <-answered; err != nil {
		t.Fatalf("Submit: %v", err)
	}
	stop()
	<-done // stopped while starting, it may report the cancel: not this test's concern
}

// A Submit that fails after validation returns the id it generated, so the
// caller's retry with it makes one task, however the first attempt ended.
func TestSubmitFailedReturnsItsID(t *testing.T) {
	_, c := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	task := client.Task{Type: "css_fix", Subject: "src/retry.css"}
	gone, stop := context.WithCancel(ctx)
	stop()
	first, err := c.Submit(gone, task)
	if err == nil || first.ID == "" {
		t.Fatalf("Submit on an ended context: %+v, %v; want an error and the generated id", first, err)
	}
	task.ID = first.ID
	if sub, err := c.Submit(ctx, task); err != nil || sub.ID != first.ID {
		t.Fatalf("retry with the id: %+v, %v", sub, err)
	}
	if again, err := c.Submit(ctx, task); err != nil || again.ID != first.ID || !again.Duplicate {
		t.Fatalf("the same id again: %+v, %v; want the duplicate answered", again, err)
	}
}
