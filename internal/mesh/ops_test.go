package mesh_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/health"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// get answers GET url: status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(body)
}

// /readyz is 503 until the service has bound its consumer (never, while
// nothing is provisioned), 200 while it consumes, 503 again once it stopped
// and once the NATS connection is closed; /healthz answers 200 throughout.
func TestReadiness(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	checks := &health.Checks{}
	mux := http.NewServeMux()
	health.Handle(mux, nc, checks)
	hs := httptest.NewServer(mux)
	defer hs.Close()
	ready := func(wantCode int, want string) {
		t.Helper()
		code, body := get(t, hs.URL+"/readyz")
		if code != wantCode || !strings.Contains(body, want) {
			t.Fatalf("/readyz = %d %q, want %d %q", code, body, wantCode, want)
		}
		if code, body := get(t, hs.URL+"/healthz"); code != http.StatusOK {
			t.Fatalf("/healthz = %d %q while the process runs", code, body)
		}
	}
	ready(http.StatusServiceUnavailable, "not ready: starting")

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	run := func(ctx context.Context) error {
		return mesh.Run(ctx, mesh.Options{NC: nc, Services: []string{mesh.Verifier}, Log: quiet, Health: checks})
	}
	// Nothing provisioned: the verifier cannot bind its bucket and stops.
	if err := run(context.Background()); err == nil {
		t.Fatal("the verifier started without a stream")
	}
	ready(http.StatusServiceUnavailable, "verifier: starting")

	if _, err := services.Provision(context.Background(), js, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	deadline := time.Now().Add(patience) // a deadlock guard
	for {
		code, body := get(t, hs.URL+"/readyz")
		if code == http.StatusOK && body == "ready\n" {
			break
		}
		if !strings.Contains(body, "verifier: starting") && !strings.Contains(body, "verifier: not consuming") || time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q while the verifier starts", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ready(http.StatusServiceUnavailable, "verifier: not consuming (durable verifier)")

	nc.Close()
	ready(http.StatusServiceUnavailable, "not ready: nats: closed")
}

// discover sends a $SRV request as `nats micro ls` does — to every
// instance of every service — and collects the answers until want
// services answered (or patience ran out).
func discover[T any](t *testing.T, nc *nats.Conn, subject string, want int) []T {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		t.Fatal(err)
	}
	var out []T
	for len(out) < want {
		msg, err := sub.NextMsg(patience)
		if err != nil {
			t.Fatalf("%s: %d answers, want %d: %v", subject, len(out), want, err)
		}
		var v T
		if err := json.Unmarshal(msg.Data, &v); err != nil {
			t.Fatalf("%s answered %q: %v", subject, msg.Data, err)
		}
		out = append(out, v)
	}
	return out
}

// Every service answers micro's discovery as dispatch-<service>, with its
// name, version, instance and id, and its counters: after three tasks each
// stage handled exactly three messages, none failed, none is in flight.
func TestEveryServiceAnswersMicroDiscovery(t *testing.T) {
	e := newEnv(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("the fix")}
	}, &policy.File{Types: map[string]policy.Type{ // a verifier, so every stage has work
		"ok_fix": {Verifier: &policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"true"}}},
	}})
	e.start()
	for i := range 3 {
		e.waitEnd(e.submit(events.Submit{ID: fmt.Sprintf("ops%d", i), Type: "ok_fix", Subject: fmt.Sprintf("ops%d.go", i)}))
	}
	nc := e.srv.NC

	want := []string{services.MicroService}
	for _, s := range mesh.All {
		want = append(want, services.OpsName(s))
	}
	var names []string
	for _, p := range discover[micro.Ping](t, nc, "$SRV.PING", len(want)) {
		names = append(names, p.Name)
		if p.ID == "" || p.Version == "" {
			t.Errorf("%s answered ping without id or version: %+v", p.Name, p)
		}
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("$SRV.PING answered by %v, want %v", names, want)
	}
	for _, info := range discover[micro.Info](t, nc, "$SRV.INFO", len(want)) {
		if info.Name == services.MicroService {
			continue
		}
		service := strings.TrimPrefix(info.Name, services.MicroService+"-")
		if info.Metadata["service"] != service || info.Metadata["instance"] == "" || len(info.Endpoints) != 1 ||
			info.Endpoints[0].Subject != services.HealthSubject(service) {
			t.Errorf("$SRV.INFO of %s: %+v", info.Name, info)
		}
	}

	for _, s := range mesh.All {
		name := services.OpsName(s)
		wantHandled := int64(3)
		if s == mesh.Reaper {
			wantHandled = 0
		}
		// The recorder acks its last message after the event the test saw.
		deadline := time.Now().Add(patience) // a deadlock guard
		var st services.OpsStatus
		for {
			stats := discover[micro.Stats](t, nc, "$SRV.STATS."+name, 1)[0]
			if len(stats.Endpoints) != 1 {
				t.Fatalf("$SRV.STATS.%s has endpoints %+v", name, stats.Endpoints)
			}
			st = services.OpsStatus{}
			if err := json.Unmarshal(stats.Endpoints[0].Data, &st); err != nil {
				t.Fatalf("$SRV.STATS.%s data %q: %v", name, stats.Endpoints[0].Data, err)
			}
			if st.Handled == wantHandled && st.InFlight == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if want := (services.OpsStatus{Service: s, Instance: st.Instance, Ready: true,
			RunCounts: services.RunCounts{Running: true, Handled: wantHandled}}); st != want || st.Instance == "" {
			t.Errorf("%s stats %+v, want %+v", name, st, want)
		}
	}

	// The health endpoint answers the same status.
	msg, err := nc.Request(services.HealthSubject(mesh.Gate), nil, patience)
	if err != nil {
		t.Fatal(err)
	}
	var st services.OpsStatus
	if err := json.Unmarshal(msg.Data, &st); err != nil || !st.Ready || st.Handled != 3 {
		t.Fatalf("%s answered %s (%v)", services.HealthSubject(mesh.Gate), msg.Data, err)
	}
}
