// Package reviewtest runs the whole mesh in a test — an embedded JetStream
// server, the fake OpenAI server and every service — with a review client
// on it, for end-to-end tests of human review (package review, the web page,
// the CLI). Only tests import it.
package reviewtest

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Patience bounds every wait for the mesh. It is a deadlock guard, not a
// timing assertion.
const Patience = 60 * time.Second

// Options of Start.
type Options struct {
	// Policy of the task types. Default: built-in defaults.
	Policy *policy.File
	// Scoring is the trust scoring of the gate and of the review client.
	Scoring trust.Policy
	// Registry, when set, receives the mesh's metrics.
	Registry prometheus.Registerer
}

// Mesh is a running mesh with a review client.
type Mesh struct {
	t      testing.TB
	Srv    *natstest.Server
	Model  *openaitest.Server
	Review *review.Client
	Tasks  *services.TaskStore
	// Policy follows the policy bucket, where Start puts Options.Policy.
	Policy *policy.Source
	// Shadow follows the bucket's shadow policy (dispatch policy shadow),
	// as the mesh's gate and recorder see it.
	Shadow *policy.Source
}

// Start runs every service against a fresh embedded server, the model
// answering with script; everything stops at cleanup.
func Start(t testing.TB, script openaitest.Script, o Options) *Mesh {
	t.Helper()
	m := &Mesh{t: t, Srv: natstest.Start(t), Model: openaitest.New(t, script)}
	nc, _ := m.Srv.Connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	// The policy lives in its bucket, as in production: every event names
	// its revision, and dispatch rebuild reads it back from there.
	stores, err := services.Provision(ctx, m.Srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policykv.Put(ctx, stores.Policy, o.Policy); err != nil {
		t.Fatal(err)
	}
	if m.Policy, err = policykv.Watch(ctx, m.Srv.JS, stores.Policy, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	m.Shadow, err = policykv.WatchWith(ctx, stores.Policy, policykv.WatchOptions{JS: m.Srv.JS, Key: policy.ShadowKey, Quiet: true,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- mesh.Run(ctx, mesh.Options{
			NC: nc, Provision: true, Policy: m.Policy, Shadow: m.Shadow, Scoring: o.Scoring, Registry: o.Registry,
			Model:   executor.NewOpenAI(executor.OpenAIConfig{BaseURL: m.Model.BaseURL(), APIKey: "test"}),
			Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
			AckWait: 2 * time.Second, Grace: 5 * time.Second, Instance: "test",
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mesh stopped with %v", err)
		}
	})
	m.waitProvisioned()
	rc, err := review.New(review.Config{
		JS: m.Srv.JS, Policy: m.Policy, Scoring: o.Scoring,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close) // before the mesh and the server stop
	m.Review = rc
	return m
}

func (m *Mesh) waitProvisioned() {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Patience)
	defer cancel()
	for {
		_, err := m.Srv.JS.KeyValue(ctx, services.BucketTrust)
		kv, err2 := m.Srv.JS.KeyValue(ctx, services.BucketTasks)
		// The buckets exist before the services run (the policy is put
		// first): wait for the submit API as well, the last one started.
		_, err3 := m.Srv.NC.Request("$SRV.PING."+services.MicroService, nil, time.Second)
		if err == nil && err2 == nil && err3 == nil {
			m.Tasks = services.NewTaskStore(kv)
			return
		}
		if ctx.Err() != nil {
			m.t.Fatalf("mesh never provisioned: %v %v %v", err, err2, err3)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Submit publishes a task like any client and returns its id.
func (m *Mesh) Submit(s events.Submit) string {
	m.t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		m.t.Fatal(err)
	}
	m.SubmitRaw(s.Type, data)
	return s.ID
}

// SubmitRaw publishes raw bytes on dispatch.submit.<type>.
func (m *Mesh) SubmitRaw(taskType string, data []byte) {
	m.t.Helper()
	if _, err := m.Srv.JS.Publish(context.Background(), events.SubmitSubject(taskType), data); err != nil {
		m.t.Fatalf("publish: %v", err)
	}
}

// WaitStage follows the task's events until n of them are of stage (a task
// stage, or review.<reason>) and returns every event up to that one.
func (m *Mesh) WaitStage(id, stage string, n int) []timeline.Entry {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Patience)
	defer cancel()
	var all []timeline.Entry
	seen := 0
	err := timeline.Follow(ctx, m.Srv.JS, id, true, func(e timeline.Entry) bool {
		all = append(all, e)
		if e.Stage == stage {
			seen++
		}
		return seen < n
	})
	if err != nil {
		m.t.Fatalf("task %s: waiting for %d× %s: %v; events: %v", id, n, stage, err, timeline.Stages(all))
	}
	return all
}

// Events returns every event of the task stored so far.
func (m *Mesh) Events(id string) []timeline.Entry {
	m.t.Helper()
	all, err := m.Review.Timeline(context.Background(), id)
	if err != nil {
		m.t.Fatal(err)
	}
	return all
}

// State returns the task's current state.
func (m *Mesh) State(id string) events.TaskState {
	m.t.Helper()
	st, err := m.Tasks.Get(context.Background(), id)
	if err != nil {
		m.t.Fatalf("state of %s: %v", id, err)
	}
	return st
}

// LastPrompt is the user message of the model's last request.
func (m *Mesh) LastPrompt() string {
	reqs := m.Model.Requests()
	if len(reqs) == 0 {
		return ""
	}
	var b strings.Builder
	for _, msg := range reqs[len(reqs)-1].Messages {
		b.WriteString(msg.Content)
		b.WriteString("\n")
	}
	return b.String()
}

// FailUnless is a model script that fails every call whose prompt lacks
// want and succeeds once it is there (a reviewer's note, say).
func FailUnless(want string) openaitest.Script {
	return func(n int, req openaitest.Request) openaitest.Reply {
		for _, msg := range req.Messages {
			if strings.Contains(msg.Content, want) {
				return openaitest.Reply{Content: openaitest.Success("followed the reviewer's note")}
			}
		}
		return openaitest.Reply{Content: openaitest.Failure("approach "+string(rune('a'+n%26)), "still broken")}
	}
}
