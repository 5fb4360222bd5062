package spendbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

// meshEnd is how one task ended in the mesh, as its task state and the
// stream tell it.
type meshEnd struct {
	state events.TaskState
	found bool
	// endRecords counts the task's end records on the stream: succeeded,
	// cancelled, and review records gated, escalated, stuck, poison.
	endRecords int
	poison     bool
}

// RunMesh runs the tasks through a fresh mesh — an embedded JetStream
// server in a temporary directory, every service, the OpenAI model pointed
// at a fresh scripted server — delivering them as cfg.Mode says, and waits
// until every task's state is terminal (or cfg.Wait passes). The figures
// come from the server's ledger; the task states say only how each task
// ended and how many attempts the mesh counted.
func RunMesh(ctx context.Context, cfg Config, tasks []Task) (Figures, error) {
	cfg = cfg.withDefaults()
	pol, err := cfg.policy()
	if err != nil {
		return Figures{}, err
	}
	shadow, err := cfg.shadow()
	if err != nil {
		return Figures{}, err
	}
	model, err := StartServer(cfg.Latency)
	if err != nil {
		return Figures{}, err
	}
	defer model.Close()
	ns, dir, err := startNATS()
	if err != nil {
		return Figures{}, err
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}()
	meshNC, err := nats.Connect(ns.ClientURL(), nats.Name("spendbench-mesh"), nats.MaxReconnects(-1))
	if err != nil {
		return Figures{}, err
	}
	defer meshNC.Close()
	nc, err := nats.Connect(ns.ClientURL(), nats.Name("spendbench-client"), nats.MaxReconnects(-1))
	if err != nil {
		return Figures{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return Figures{}, err
	}

	m := startMesh(ctx, cfg, pol, shadow, model, meshNC)
	defer m.cancel()
	kv, err := waitBucket(ctx, js, m.stopped)
	if err != nil {
		_ = m.stop()
		return Figures{}, err
	}

	start := time.Now()
	waitCtx, cancelWait := context.WithTimeout(ctx, cfg.Wait)
	defer cancelWait()
	done := make(chan map[string]events.TaskState, 1)
	endedAt := make(chan map[string]time.Time, 1)
	watchErr := make(chan error, 1)
	go func() {
		states, ended, err := waitTerminal(waitCtx, js, kv, tasks)
		done <- states
		endedAt <- ended
		watchErr <- err
	}()
	submitted := make(map[string]time.Time, len(tasks))
	if err := deliver(ctx, cfg, tasks, func(t Task) error {
		submitted[t.ID] = time.Now()
		return submit(ctx, js, t)
	}); err != nil {
		_ = m.stop()
		return Figures{}, err
	}
	states := <-done
	ended := <-endedAt
	werr := <-watchErr
	wall := time.Since(start)
	if werr != nil && ctx.Err() != nil {
		_ = m.stop()
		return Figures{}, ctx.Err()
	}
	if cfg.Inspect != nil {
		if err := cfg.Inspect(ctx, js); err != nil {
			_ = m.stop()
			return Figures{}, err
		}
	}
	if err := m.stop(); err != nil {
		return Figures{}, fmt.Errorf("mesh: %w", err)
	}

	ends, err := collectEnds(ctx, js, kv, tasks, states)
	if err != nil {
		return Figures{}, err
	}
	outcomes := meshOutcomes(tasks, ends, submitted, ended)
	f := figures(RunnerMesh, cfg.Mode, tasks, outcomes, model.Ledger(), model.Unassigned())
	f.setWall(wall)
	return f, nil
}

// meshProcess is a mesh running in this process (startMesh).
type meshProcess struct {
	cancel  context.CancelFunc // stops it
	stopped chan error         // receives what mesh.Run returned
}

// startMesh runs every service on nc, with the policy pol (and the shadow
// policy shadow, nil: the bucket's) and the OpenAI
// model that model serves, until ctx ends or stop is called.
func startMesh(ctx context.Context, cfg Config, pol, shadow *policy.Source, model *Server, nc *nats.Conn) *meshProcess {
	meshCtx, stopMesh := context.WithCancel(ctx)
	m := &meshProcess{cancel: stopMesh, stopped: make(chan error, 1)}
	go func() {
		m.stopped <- mesh.Run(meshCtx, mesh.Options{
			NC: nc, Provision: true, Policy: pol, Shadow: shadow, Registry: cfg.Registry,
			Model:        executor.NewOpenAI(executor.OpenAIConfig{BaseURL: model.BaseURL(), APIKey: "sk-spendbench"}),
			DefaultModel: cfg.Model,
			Instance:     "spendbench",
			// The scripted provider refuses the key (or the quota) of a
			// badkey or quota ticket only, and takes it for the next: the
			// key's mark, which would stop every later call with it (the
			// right thing with a real provider), ends at once here.
			Circuit: executor.CircuitConfig{DeadFor: time.Nanosecond},
			Log:     cfg.Log,
			Grace:   5 * time.Second,
		})
	}()
	return m
}

// stop stops the mesh and returns its error if it failed (not if it was
// stopped); it waits a minute at most. Call it once.
func (m *meshProcess) stop() error {
	m.cancel()
	select {
	case err := <-m.stopped:
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		return err
	case <-time.After(time.Minute):
		return errors.New("the mesh did not stop within a minute")
	}
}

// meshOutcomes is how each task ended, as the mesh tells it (ends), and
// how long it took from its submission (submitted) to its end (ended).
func meshOutcomes(tasks []Task, ends map[string]meshEnd, submitted, ended map[string]time.Time) map[string]outcome {
	outcomes := make(map[string]outcome, len(tasks))
	for _, t := range tasks {
		e := ends[t.ID]
		o := outcome{ended: e.found && events.Terminal(e.state.Status), endRecords: e.endRecords, poison: e.poison}
		if at, ok := ended[t.ID]; ok && o.ended {
			o.seconds = at.Sub(submitted[t.ID]).Seconds()
		}
		if e.found {
			o.status = string(e.state.Status)
			o.resolved = e.state.Status == events.StatusSucceeded
			o.clientTokens = e.state.TokensIn + e.state.TokensOut
			st := e.state
			o.mesh = &st
		} else {
			o.status = "missing"
		}
		outcomes[t.ID] = o
	}
	return outcomes
}

// startNATS starts a JetStream server on a random local port with its store
// in a new temporary directory.
func startNATS() (*server.Server, string, error) {
	dir, err := os.MkdirTemp("", "spendbench-*")
	if err != nil {
		return nil, "", err
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: "spendbench", Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, "", err
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		_ = os.RemoveAll(dir)
		return nil, "", errors.New("embedded NATS server not ready")
	}
	return ns, dir, nil
}

// waitBucket waits until the mesh has provisioned the task bucket.
func waitBucket(ctx context.Context, js jetstream.JetStream, stopped <-chan error) (jetstream.KeyValue, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		kv, err := js.KeyValue(ctx, services.BucketTasks)
		if err == nil {
			return kv, nil
		}
		select {
		case err := <-stopped:
			return nil, fmt.Errorf("mesh stopped before it provisioned: %v", err)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("mesh never provisioned: %w", err)
		}
	}
}

// submit publishes a task on dispatch.submit.<type> like any client.
func submit(ctx context.Context, js jetstream.JetStream, t Task) error {
	data, err := json.Marshal(events.Submit{ID: t.ID, Type: t.TaskType(), Subject: t.Subject, Payload: t.Payload})
	if err != nil {
		return err
	}
	_, err = js.Publish(ctx, events.SubmitSubject(t.TaskType()), data, jetstream.WithMsgID("submit:"+t.ID))
	return err
}

// Quiet is how long every task must have stayed settled — terminal, or
// held for its type's trust — before the mesh run counts them so: a held
// task whose type a probe re-opens is re-admitted within the gate's
// MaxHeldDelay, so a task held at one moment may still be resolved.
const Quiet = 12 * time.Second

// waitTerminal watches the task bucket until every task's status is
// settled (events.Settled: terminal or held) and nothing changed for
// Quiet, and returns the last state seen of each and when each was last
// seen becoming terminal. When ctx ends first it returns what it has with
// ctx's error.
func waitTerminal(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, tasks []Task) (map[string]events.TaskState, map[string]time.Time, error) {
	want := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		want[t.ID] = true
	}
	states := make(map[string]events.TaskState, len(tasks))
	endedAt := make(map[string]time.Time, len(tasks))
	w, err := follow.WatchAll(ctx, js, kv, follow.WatchOptions{})
	if err != nil {
		return states, endedAt, err
	}
	defer func() { _ = w.Stop() }()
	open, held := len(want), 0
	quiet := time.NewTimer(Quiet)
	defer quiet.Stop()
	for {
		var timeout <-chan time.Time
		switch {
		case open > 0:
		case held == 0:
			return states, endedAt, nil // all terminal: nothing can change by itself
		default:
			timeout = quiet.C
		}
		select {
		case <-ctx.Done():
			return states, endedAt, ctx.Err()
		case <-timeout:
			return states, endedAt, nil
		case e, ok := <-w.Updates():
			if !ok {
				return states, endedAt, errors.New("task bucket watcher closed")
			}
			if e == nil || !want[e.Key()] || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var st events.TaskState
			if json.Unmarshal(e.Value(), &st) != nil {
				continue
			}
			was, seen := states[e.Key()]
			states[e.Key()] = st
			settled, wasSettled := events.Settled(st.Status), seen && events.Settled(was.Status)
			switch {
			case settled && !wasSettled:
				open--
			case !settled && wasSettled:
				open++ // a held task re-admitted, or a human moved a task on
			}
			if st.Status == events.StatusHeld {
				held++
			}
			if seen && was.Status == events.StatusHeld {
				held--
			}
			if events.Terminal(st.Status) && (!seen || !events.Terminal(was.Status)) {
				endedAt[e.Key()] = time.Now()
			}
			quiet.Reset(Quiet)
		}
	}
}

// collectEnds reads every task's final state and counts its end records on
// the stream.
func collectEnds(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, tasks []Task, seen map[string]events.TaskState) (map[string]meshEnd, error) {
	ends := make(map[string]meshEnd, len(tasks))
	store := services.NewTaskStore(kv)
	for _, t := range tasks {
		st, err := store.Get(ctx, t.ID)
		switch {
		case err == nil:
			ends[t.ID] = meshEnd{state: st, found: true}
		case errors.Is(err, services.ErrTaskNotFound):
			if s, ok := seen[t.ID]; ok {
				ends[t.ID] = meshEnd{state: s, found: true}
			} else {
				ends[t.ID] = meshEnd{}
			}
		default:
			return nil, fmt.Errorf("state of %s: %w", t.ID, err)
		}
	}
	stream, err := js.Stream(ctx, services.Stream)
	if err != nil {
		return nil, err
	}
	for _, filter := range []string{events.StageFilter(events.StageSucceeded), events.StageFilter(events.StageCancelled), events.ReviewFilter} {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			return nil, err
		}
		for subject, n := range info.State.Subjects {
			id := ""
			poison := false
			if tid, _, ok := events.ParseTaskSubject(subject); ok {
				id = tid
			} else if reason, key, ok := events.ParseReviewSubject(subject); ok {
				switch reason {
				case events.ReviewGated, events.ReviewEscalated, events.ReviewStuck:
				case events.ReviewPoison:
					poison = true
				default:
					continue // rejected input, human actions
				}
				id = key
			}
			e, ok := ends[id]
			if !ok {
				continue
			}
			e.endRecords += int(n)
			e.poison = e.poison || poison
			ends[id] = e
		}
	}
	return ends, nil
}
