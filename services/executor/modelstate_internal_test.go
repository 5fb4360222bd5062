package executor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// Concurrent failures reported through two instances' stores of one
// bucket are all counted: every write is a compare-and-set.
func TestModelCircuitCountsEveryFailureAcrossInstances(t *testing.T) {
	ns := natstest.Start(t)
	ctx := context.Background()
	kv, err := ns.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "dispatch_models"})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := CircuitConfig{Threshold: 1000, Window: time.Hour}.withDefaults()
	var states []*modelStates
	for range 2 {
		st, err := newKVStore(ctx, kv, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.close)
		states = append(states, &modelStates{cfg: cfg, store: st, log: log})
	}
	now := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	const writers, each = 4, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			m := states[w%2]
			for range each {
				m.done(ctx, "circuit.x", "m", now, false, true)
			}
		})
	}
	wg.Wait()
	e, err := kv.Get(ctx, "circuit.x")
	if err != nil {
		t.Fatal(err)
	}
	c, err := decodeCircuit(e.Value())
	if err != nil {
		t.Fatal(err)
	}
	if c.Failures != writers*each || c.Model != "m" {
		t.Errorf("circuit %+v, want %d failures counted", c, writers*each)
	}
}

// A value in the bucket that is not a circuit or a mark is taken as none.
func TestModelStatesIgnoreForgedValues(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := &modelStates{cfg: CircuitConfig{Threshold: 1}.withDefaults(), store: &memStore{}, log: log}
	ctx := context.Background()
	now := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	for _, bad := range []string{`{"state": 7}`, `not json`, `{"state": 2, "failures": -1}`} {
		_, rev := m.store.get("circuit.x")
		if _, err := m.store.put(ctx, "circuit.x", []byte(bad), rev); err != nil {
			t.Fatal(err)
		}
		if ok, _, _, _ := m.allow(ctx, "circuit.x", "m", now); !ok {
			t.Errorf("%s: call refused, want the circuit taken as closed", bad)
		}
	}
	_, rev := m.store.get("dead.x")
	if _, err := m.store.put(ctx, "dead.x", []byte(`{"class":"task","until":"2030-01-01T00:00:00Z"}`), rev); err != nil {
		t.Fatal(err)
	}
	if _, dead := m.dead("dead.x", 0, true, now); dead {
		t.Error("a mark whose class is not a deployment fault stops calls")
	}
}

func FuzzDecodeCircuit(f *testing.F) {
	good, _ := json.Marshal(circuit{Model: "m", State: CircuitOpen, CoolDown: time.Second, Until: time.Unix(1e9, 0)})
	f.Add(good)
	f.Add([]byte(`{"state":1,"failures":3}`))
	f.Add([]byte(`{"state":-1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := decodeCircuit(data)
		if err != nil {
			if c != (circuit{}) {
				t.Fatalf("error %v with a circuit %+v", err, c)
			}
			return
		}
		if c.State < CircuitClosed || c.State > CircuitOpen || c.Failures < 0 || c.CoolDown < 0 {
			t.Fatalf("decoded an out-of-range circuit %+v", c)
		}
		// what decodes is used: its transitions never panic
		cfg := CircuitConfig{}.withDefaults()
		next, _, _, _, _ := c.allow(cfg, time.Unix(1e9, 0))
		next.done(cfg, time.Unix(1e9, 0), true, true)
	})
}

func FuzzDecodeDeadMark(f *testing.F) {
	good, _ := json.Marshal(deadMark{Model: "m", Class: events.ErrorClassAuth, Fix: "check the key", Until: time.Unix(1e9, 0)})
	f.Add(good)
	f.Add([]byte(`{"class":"transient"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := decodeDeadMark(data)
		if err == nil && !events.DeploymentFault(d.Class) {
			t.Fatalf("decoded a mark of class %q", d.Class)
		}
	})
}

// When a shared circuit's cool-down ends, the instances asking at once
// let exactly one probe through: the half-open write is a compare-and-set.
func TestModelCircuitLetsOneProbeAcrossInstances(t *testing.T) {
	ns := natstest.Start(t)
	ctx := context.Background()
	kv, err := ns.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "dispatch_models"})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := CircuitConfig{Threshold: 1, CoolDown: 10 * time.Second}.withDefaults()
	var states []*modelStates
	for range 4 {
		st, err := newKVStore(ctx, kv, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.close)
		states = append(states, &modelStates{cfg: cfg, store: st, log: log})
	}
	t0 := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	if _, opened := states[0].done(ctx, "circuit.x", "m", t0, false, true); !opened {
		t.Fatal("the failure did not open the circuit")
	}
	// every instance's watcher has seen it open (a deadlock guard, not a
	// timing assertion)
	deadline := time.Now().Add(10 * time.Second)
	for _, m := range states {
		for {
			if data, rev := m.store.get("circuit.x"); rev > 0 {
				if c, _ := decodeCircuit(data); c.State == CircuitOpen {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("an instance never saw the circuit open")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		probes int
	)
	for _, m := range states {
		wg.Go(func() {
			for range 5 {
				ok, probe, _, _ := m.allow(ctx, "circuit.x", "m", t0.Add(cfg.CoolDown))
				if ok && probe {
					mu.Lock()
					probes++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if probes != 1 {
		t.Errorf("%d probes let through by 4 instances, want 1", probes)
	}
}

// brokenStore is a store whose writes fail while down is set.
type brokenStore struct {
	memStore
	down bool
}

func (s *brokenStore) put(ctx context.Context, key string, data []byte, rev uint64) (uint64, error) {
	if s.down {
		return 0, errors.New("nats: no responders available for request")
	}
	return s.memStore.put(ctx, key, data, rev)
}

// While the bucket takes no writes, the instance keeps its circuits and
// marks itself: the circuit still opens, a mark still stops calls; once
// the bucket takes writes again, they go there.
func TestModelStatesHoldWhatTheBucketWouldNotTake(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	store := &brokenStore{down: true}
	m := &modelStates{cfg: CircuitConfig{Threshold: 2, CoolDown: time.Minute}.withDefaults(), store: store, log: log}
	ctx := context.Background()
	now := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	for range 2 {
		m.done(ctx, "circuit.x", "m", now, false, true)
	}
	if ok, _, _, _ := m.allow(ctx, "circuit.x", "m", now); ok {
		t.Error("circuit closed after 2 failures while the bucket failed: want it open")
	}
	m.markDead(ctx, "dead.x", deadMark{Model: "m", Class: events.ErrorClassAuth, Fix: "fix", Until: now.Add(time.Hour)})
	if _, dead := m.dead("dead.x", 0, true, now); !dead {
		t.Error("a mark the bucket would not take is lost")
	}
	if n := strings.Count(logs.String(), "not shared"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs.String())
	}
	store.down = false
	m.markDead(ctx, "dead.x", deadMark{Model: "m", Class: events.ErrorClassAuth, Fix: "fix", Until: now.Add(time.Hour)})
	if _, rev := store.get("dead.x"); rev == 0 {
		t.Error("the mark did not reach the bucket once it took writes again")
	}
	if _, dead := m.dead("dead.x", 0, true, now); !dead {
		t.Error("the mark in the bucket does not stop calls")
	}
}

// An API root is known by its scheme, host and path, however the policy
// spells them; a value that is not a URL is kept.
func TestNormaliseURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://X.example/v1/":  "https://x.example/v1",
		"HTTPS://x.example/v1":   "https://x.example/v1",
		"https://x.example/v1":   "https://x.example/v1",
		"http://ollama:11434/v1": "http://ollama:11434/v1",
		"https://x.example/":     "https://x.example",
		"executor.Simulated":     "executor.Simulated",
	} {
		if got := normaliseURL(in); got != want {
			t.Errorf("normaliseURL(%q) = %q, want %q", in, got, want)
		}
	}
}
