package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// modelStates are the facts about models that every executor instance
// shares (bucket dispatch_models, or this instance's memory): each model's
// circuit (circuitKey) and the marks of deployments found wrong (deadKey).
// Every write is a compare-and-set from the value last seen; a store that
// cannot be written is logged and the instance decides alone (a breaker
// must never stop calls for its own outage): it keeps the value it could
// not write in its memory (local) and reads that until a write of the key
// goes through again.
type modelStates struct {
	cfg   CircuitConfig
	store stateStore
	log   *slog.Logger

	mu       sync.Mutex
	local    map[string][]byte
	unshared bool // a write failed since the last one that held: logged once
}

// get is the value at key: this instance's own when the store would not
// take it, else the store's (whose revision a write starts from).
func (m *modelStates) get(key string) (data []byte, local bool, rev uint64) {
	data, rev = m.store.get(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.local[key]; ok {
		return v, true, rev
	}
	return data, false, rev
}

// keep holds data at key in this instance's memory: the store failed to
// take it (err).
func (m *modelStates) keep(key, label string, data []byte, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.local == nil {
		m.local = map[string][]byte{}
	}
	m.local[key] = data
	if !m.unshared {
		m.unshared = true
		m.log.Warn("model state not shared: this instance decides alone until the bucket takes writes again", "model", label, "err", err)
	}
}

// shared says the store took key's value: this instance's own is dropped.
func (m *modelStates) shared(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.local, key)
	if m.unshared && len(m.local) == 0 {
		m.unshared = false
		m.log.Info("model state shared again")
	}
}

// maxCAS bounds the compare-and-set retries of one update (each lost one
// means another instance's update went in).
const maxCAS = 100

// update applies tr to the circuit at key until its write holds; label
// says what the circuit is for. It returns the circuit as written (or as
// decided, when the store failed).
func (m *modelStates) update(ctx context.Context, key, label string, tr func(circuit) (circuit, bool)) circuit {
	var next circuit
	for range maxCAS {
		data, local, rev := m.get(key)
		var cur circuit
		if rev > 0 || local {
			var err error
			if cur, err = decodeCircuit(data); err != nil {
				m.log.Warn("model circuit unreadable: taken as closed", "key", key, "err", err)
			}
		}
		var changed bool
		next, changed = tr(cur)
		if !changed {
			return next
		}
		next.Model = label
		b, err := json.Marshal(next)
		if err != nil {
			return next
		}
		_, err = m.store.put(ctx, key, b, rev)
		if err == nil {
			m.shared(key)
			return next
		}
		if !errors.Is(err, errStale) {
			m.keep(key, label, b, err)
			return next
		}
		// another instance wrote it: the bucket works, its value wins
		m.shared(key)
		if err := m.store.refresh(ctx, key); err != nil {
			m.keep(key, label, b, err)
			return next
		}
	}
	m.log.Warn("model circuit not shared: too many concurrent updates, this instance decides alone", "model", label)
	return next
}

// allow asks to call the model whose circuit is key.
func (m *modelStates) allow(ctx context.Context, key, label string, now time.Time) (ok, probe bool, wait time.Duration, state int) {
	c := m.update(ctx, key, label, func(c circuit) (circuit, bool) {
		next, o, p, w, changed := c.allow(m.cfg, now)
		ok, probe, wait = o, p, w
		return next, changed
	})
	return ok, probe, wait, c.State
}

// done reports a call's outcome; opened says it began a cool-down.
func (m *modelStates) done(ctx context.Context, key, label string, now time.Time, probe, failed bool) (state int, opened bool) {
	c := m.update(ctx, key, label, func(c circuit) (circuit, bool) {
		next, changed, o := c.done(m.cfg, now, probe, failed)
		opened = o
		return next, changed
	})
	return c.State, opened
}

// release gives back a probe abandoned without an outcome.
func (m *modelStates) release(ctx context.Context, key, label string, now time.Time, probe bool) {
	if !probe {
		return
	}
	m.update(ctx, key, label, func(c circuit) (circuit, bool) { return c.release(now, probe) })
}

// deadMark says a model's deployment was found wrong: a call got Class,
// which Fix says how to mend. It holds under the policy revision Rev until
// Until.
type deadMark struct {
	Model string            `json:"model"`
	Class events.ErrorClass `json:"class"`
	Fix   string            `json:"fix"`
	Rev   uint64            `json:"policy_rev"`
	At    time.Time         `json:"at"`
	Until time.Time         `json:"until"`
}

// decodeDeadMark reads a mark from the bucket (outside input, as
// decodeCircuit): one that does not decode, or whose class is not a
// deployment fault, is an error and marks nothing.
func decodeDeadMark(data []byte) (deadMark, error) {
	var d deadMark
	if err := json.Unmarshal(data, &d); err != nil {
		return deadMark{}, fmt.Errorf("model mark: %w", err)
	}
	if !events.DeploymentFault(d.Class) {
		return deadMark{}, fmt.Errorf("model mark: class %q is not a deployment fault", d.Class)
	}
	return d, nil
}

// dead returns the mark at key if it holds at now: under policy revision
// rev, or under any when anyRev (a key's mark: a policy edit does not
// mend a refused key).
func (m *modelStates) dead(key string, rev uint64, anyRev bool, now time.Time) (deadMark, bool) {
	data, local, r := m.get(key)
	if r == 0 && !local {
		return deadMark{}, false
	}
	d, err := decodeDeadMark(data)
	if err != nil {
		m.log.Warn("model mark unreadable: ignored", "key", key, "err", err)
		return deadMark{}, false
	}
	if (anyRev || d.Rev == rev) && now.Before(d.Until) {
		return d, true
	}
	return deadMark{}, false
}

// markDead writes d at key, over whatever mark was there.
func (m *modelStates) markDead(ctx context.Context, key string, d deadMark) {
	b, err := json.Marshal(d)
	if err != nil {
		return
	}
	for range maxCAS {
		_, rev := m.store.get(key)
		_, err = m.store.put(ctx, key, b, rev)
		if !errors.Is(err, errStale) {
			break
		}
		if err = m.store.refresh(ctx, key); err != nil {
			break
		}
	}
	if err != nil {
		m.keep(key, d.Model, b, err)
		return
	}
	m.shared(key)
}

// stateKey is a bucket key for the parts: kind, then a hash of the rest
// (an endpoint URL, a model name, a key's fingerprint are not key tokens).
func stateKey(kind string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return kind + "." + hex.EncodeToString(sum[:16])
}

// fingerprint names an API key without holding it.
func fingerprint(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("dispatch-key\x00" + key))
	return hex.EncodeToString(sum[:8])
}
