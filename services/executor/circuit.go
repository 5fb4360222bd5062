package executor

import (
	"encoding/json"
	"fmt"
	"time"
)

// CircuitConfig configures the circuit breaker kept per model (a model at
// its endpoint) and per agent command. The breakers live in the shared
// bucket dispatch_models when Config.ModelStates is set — every executor
// instance sees one model's cool-down — else in this instance's memory.
// The zero value is the default.
type CircuitConfig struct {
	// Threshold is how many transient failures within Window open the
	// circuit (a success before then starts the count over). Default 5;
	// negative disables the breaker.
	Threshold int
	// Window is how far apart the first and the last of Threshold failures
	// may be. Default 1m.
	Window time.Duration
	// CoolDown is how long the circuit stays open before one probe call is
	// let through. It doubles each time a probe fails. Default 30s.
	CoolDown time.Duration
	// MaxCoolDown caps the doubling. Default 5m.
	MaxCoolDown time.Duration
	// DeadFor is how long a model whose deployment is wrong — its key
	// refused (401, 403), its quota spent, the model not found (404) — is
	// not called again by any instance; a new policy revision or a new key
	// (another DISPATCH_CREDENTIAL_* value) ends it at once. Default 1h.
	DeadFor time.Duration
}

func (c CircuitConfig) withDefaults() CircuitConfig {
	if c.Threshold == 0 {
		c.Threshold = 5
	}
	if c.Window <= 0 {
		c.Window = time.Minute
	}
	if c.CoolDown <= 0 {
		c.CoolDown = 30 * time.Second
	}
	if c.MaxCoolDown <= 0 {
		c.MaxCoolDown = 5 * time.Minute
	}
	c.MaxCoolDown = max(c.MaxCoolDown, c.CoolDown)
	if c.DeadFor <= 0 {
		c.DeadFor = time.Hour
	}
	return c
}

// Circuit states, as the dispatch_model_circuit_state gauge reports them.
const (
	CircuitClosed   = 0 // calls go through
	CircuitHalfOpen = 1 // one probe call is in flight, the others wait
	CircuitOpen     = 2 // no call goes through until the cool-down ends
)

// circuit is one model's breaker as the bucket stores it (JSON, one key
// per model; see circuitKey). Its transitions are pure: allow and done
// return the next value, which the store writes by compare-and-set.
//
//	closed --Threshold transient failures within Window--> open (cool-down)
//	open --cool-down over, one call allowed--> half-open (that call is the probe)
//	half-open --probe answered--> closed
//	half-open --probe failed transiently--> open (cool-down doubled, capped)
//
// "Answered" is any outcome but a transient failure: a 400 proves the
// endpoint is up. Outcomes of calls that are not the probe are ignored
// while the circuit is not closed. A probe that never reports (its worker
// died) is given up after one cool-down and another probe is allowed.
type circuit struct {
	// Model says what the circuit is for (the model and its endpoint,
	// never a key), for a human reading the bucket.
	Model    string        `json:"model,omitempty"`
	State    int           `json:"state"`
	Failures int           `json:"failures,omitempty"` // transient failures while closed, since Since
	Since    time.Time     `json:"since,omitzero"`     // the first of them
	CoolDown time.Duration `json:"cool_down,omitempty"`
	// Until is the end of the cool-down (open) or of the probe's lease
	// (half-open).
	Until time.Time `json:"until,omitzero"`
}

// allow asks to call at now. ok false means wait that long first; probe
// true means this call decides whether the circuit closes and must be
// reported with done (or given back with release). changed says next
// differs from c (it must be written).
func (c circuit) allow(cfg CircuitConfig, now time.Time) (next circuit, ok, probe bool, wait time.Duration, changed bool) {
	if cfg.Threshold < 0 || c.State == CircuitClosed {
		return c, true, false, 0, false
	}
	if now.Before(c.Until) {
		return c, false, false, c.Until.Sub(now), false
	}
	c.State, c.Until = CircuitHalfOpen, now.Add(c.CoolDown)
	return c, true, true, 0, true
}

// done reports the outcome of a call allowed at some point: failed is true
// for a transient failure. opened says this outcome opened the circuit (a
// cool-down begins).
func (c circuit) done(cfg CircuitConfig, now time.Time, probe, failed bool) (next circuit, changed, opened bool) {
	if cfg.Threshold < 0 {
		return c, false, false
	}
	prev := c
	switch {
	case c.State == CircuitClosed && !failed:
		c.Failures, c.Since = 0, time.Time{}
	case c.State == CircuitClosed:
		if c.Failures == 0 || now.Sub(c.Since) > cfg.Window {
			c.Failures, c.Since = 0, now // the window starts over
		}
		c.Failures++
		if c.Failures >= cfg.Threshold {
			c.State, c.CoolDown, c.Failures, c.Since = CircuitOpen, cfg.CoolDown, 0, time.Time{}
			c.Until = now.Add(c.CoolDown)
			opened = true
		}
	case !probe || c.State != CircuitHalfOpen:
		// a call that started before the circuit opened: the probe decides
	case !failed:
		c = circuit{Model: c.Model}
	default:
		c.CoolDown = min(2*c.CoolDown, cfg.MaxCoolDown)
		c.State, c.Until = CircuitOpen, now.Add(c.CoolDown)
		opened = true
	}
	return c, c != prev, opened
}

// release gives a probe back without an outcome (the call was abandoned at
// shutdown): the next caller may probe at once.
func (c circuit) release(now time.Time, probe bool) (circuit, bool) {
	if !probe || c.State != CircuitHalfOpen || !now.Before(c.Until) {
		return c, false
	}
	c.Until = now
	return c, true
}

// decodeCircuit reads a circuit from the bucket. Anyone allowed to write
// the bucket can put bytes there: what does not decode, or holds a state
// that is none, is an error, and the caller takes the circuit as closed
// (its next write replaces it).
func decodeCircuit(data []byte) (circuit, error) {
	var c circuit
	if err := json.Unmarshal(data, &c); err != nil {
		return circuit{}, fmt.Errorf("model circuit: %w", err)
	}
	if c.State < CircuitClosed || c.State > CircuitOpen || c.Failures < 0 || c.CoolDown < 0 {
		return circuit{}, fmt.Errorf("model circuit: state %d, failures %d, cool-down %s out of range", c.State, c.Failures, c.CoolDown)
	}
	return c, nil
}
