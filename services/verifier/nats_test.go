package verifier

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// respond answers every request on subject with reply, after checking that
// the request is the task JSON.
func respond(t *testing.T, nc *nats.Conn, subject, reply string) {
	t.Helper()
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		var task events.Task
		if err := json.Unmarshal(m.Data, &task); err != nil || task.ID == "" || m.Header.Get(events.HeaderTaskID) != task.ID {
			m.Respond([]byte(`not a task`))
			return
		}
		m.Respond([]byte(reply))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	nc.Flush()
}

func TestNATSReplies(t *testing.T) {
	srv := natstest.Start(t)
	nc, _ := srv.Connect(t)
	tests := []struct {
		name, reply string
		verdict     string
		detail      string
		err         error
	}{
		{name: "exists", reply: `{"exists": true, "detail": "still red"}`, verdict: events.VerdictExists, detail: "still red"},
		{name: "stale", reply: `{"exists": false, "detail": "fixed in abc123"}`, verdict: events.VerdictStale, detail: "fixed in abc123"},
		{name: "no detail", reply: `{"exists": false}`, verdict: events.VerdictStale},
		{name: "extra fields", reply: `{"exists": true, "checked_by": "py"}`, verdict: events.VerdictExists},
		{name: "not json", reply: `yes`, err: ErrBadReply},
		{name: "empty", reply: ``, err: ErrBadReply},
		{name: "no exists", reply: `{"detail": "hm"}`, err: ErrBadReply},
		{name: "exists not bool", reply: `{"exists": "true"}`, err: ErrBadReply},
		{name: "trailing", reply: `{"exists": true}}`, err: ErrBadReply},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			subject := "verify." + t.Name()[len("TestNATSReplies/"):]
			respond(t, srv.NC, subject, tt.reply)
			v, err := (&NATS{NC: nc, Subject: subject}).Check(context.Background(), testTask("t1"))
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.Verdict != tt.verdict || v.Detail != tt.detail || v.Verifier != "nats" {
				t.Errorf("got %+v, want verdict %q detail %q", v, tt.verdict, tt.detail)
			}
		})
	}
}

func TestNATSNoResponders(t *testing.T) {
	srv := natstest.Start(t)
	_, err := (&NATS{NC: srv.NC, Subject: "verify.nobody"}).Check(context.Background(), testTask("t1"))
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("err = %v, want no responders", err)
	}
}

func TestNATSTimeout(t *testing.T) {
	srv := natstest.Start(t)
	silent, err := srv.NC.Subscribe("verify.silent", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Unsubscribe()
	srv.NC.Flush()
	_, err = (&NATS{NC: srv.NC, Subject: "verify.silent", Timeout: 50 * time.Millisecond}).Check(context.Background(), testTask("t1"))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
}

func TestNATSShutdownIsNotAVerdict(t *testing.T) {
	srv := natstest.Start(t)
	respond(t, srv.NC, "verify.ok", `{"exists": true}`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := (&NATS{NC: srv.NC, Subject: "verify.ok"}).Check(ctx, testTask("t1"))
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestNATSNoConn(t *testing.T) {
	_, err := (&NATS{Subject: "verify.x"}).Check(context.Background(), testTask("t1"))
	if !errors.Is(err, ErrNoConn) {
		t.Fatalf("err = %v, want ErrNoConn", err)
	}
}

// addMicro runs a micro service with one endpoint on subject.
func addMicro(t *testing.T, nc *nats.Conn, subject string, h micro.HandlerFunc) {
	t.Helper()
	svc, err := micro.AddService(nc, micro.Config{
		Name: "stillbroken", Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{Subject: subject, Handler: h},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	// The subscription must reach the server before another connection asks.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestNATSMicroService(t *testing.T) {
	srv := natstest.Start(t)
	nc, _ := srv.Connect(t)
	addMicro(t, srv.NC, "verify.micro.ok", func(req micro.Request) {
		var task events.Task
		if err := json.Unmarshal(req.Data(), &task); err != nil {
			req.Error("400", "not a task", nil)
			return
		}
		req.RespondJSON(map[string]any{"exists": task.Subject == "web/app.css", "detail": "checked " + task.Subject})
	})
	addMicro(t, srv.NC, "verify.micro.down", func(req micro.Request) {
		req.Error("503", "lint backend down", nil)
	})

	v, err := (&NATS{NC: nc, Subject: "verify.micro.ok"}).Check(context.Background(), testTask("t1"))
	if err != nil || v.Verdict != events.VerdictExists || v.Detail != "checked web/app.css" {
		t.Fatalf("ok endpoint: %+v, %v", v, err)
	}

	_, err = (&NATS{NC: nc, Subject: "verify.micro.down"}).Check(context.Background(), testTask("t1"))
	var se *ServiceError
	if !errors.As(err, &se) || se.Code != "503" || se.Description != "lint backend down" {
		t.Fatalf("err = %v, want ServiceError 503", err)
	}
}
