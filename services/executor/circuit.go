package executor

import (
	"sync"
	"time"
)

// CircuitConfig configures the circuit breaker kept per model endpoint (and
// per agent command) in each executor instance. The zero value is the default.
type CircuitConfig struct {
	// Threshold is how many consecutive transient failures open the circuit.
	// Default 5; negative disables the breaker.
	Threshold int
	// CoolDown is how long the circuit stays open before one probe call is
	// let through. It doubles each time a probe fails. Default 30s.
	CoolDown time.Duration
	// MaxCoolDown caps the doubling. Default 5m.
	MaxCoolDown time.Duration
}

func (c CircuitConfig) withDefaults() CircuitConfig {
	if c.Threshold == 0 {
		c.Threshold = 5
	}
	if c.CoolDown <= 0 {
		c.CoolDown = 30 * time.Second
	}
	if c.MaxCoolDown <= 0 {
		c.MaxCoolDown = 5 * time.Minute
	}
	c.MaxCoolDown = max(c.MaxCoolDown, c.CoolDown)
	return c
}

// Circuit states, as the dispatch_executor_circuit_state gauge reports them.
const (
	CircuitClosed   = 0 // calls go through
	CircuitHalfOpen = 1 // one probe call is in flight, the others wait
	CircuitOpen     = 2 // no call goes through until the cool-down ends
)

// breaker is the state machine of one endpoint's circuit:
//
//	closed --Threshold consecutive transient failures--> open (cool-down)
//	open --cool-down over, one call allowed--> half-open (that call is the probe)
//	half-open --probe answered--> closed
//	half-open --probe failed transiently--> open (cool-down doubled, capped)
//
// "Answered" is any outcome but a transient failure: a 400 proves the
// endpoint is up. Outcomes of calls that are not the probe are ignored while
// the circuit is not closed. A probe that never reports (its worker died)
// is given up after one cool-down and another probe is allowed.
type breaker struct {
	cfg CircuitConfig

	mu       sync.Mutex
	state    int
	failures int           // consecutive transient failures while closed
	coolDown time.Duration // of the current or last opening
	until    time.Time     // open: end of the cool-down; half-open: end of the probe's lease
}

func newBreaker(cfg CircuitConfig) *breaker { return &breaker{cfg: cfg.withDefaults()} }

// allow asks to call the endpoint at now. ok false means wait that long
// first; probe true means this call decides whether the circuit closes and
// must be reported with done (or given back with release).
func (b *breaker) allow(now time.Time) (ok, probe bool, wait time.Duration) {
	if b.cfg.Threshold < 0 {
		return true, false, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case CircuitClosed:
		return true, false, 0
	default: // open, or half-open with a probe in flight
		if now.Before(b.until) {
			return false, false, b.until.Sub(now)
		}
		b.state, b.until = CircuitHalfOpen, now.Add(b.coolDown)
		return true, true, 0
	}
}

// done reports the outcome of a call allowed at some point: failed is true
// for a transient failure. It returns the state after it.
func (b *breaker) done(now time.Time, probe, failed bool) int {
	if b.cfg.Threshold < 0 {
		return CircuitClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.state == CircuitClosed && !failed:
		b.failures = 0
	case b.state == CircuitClosed:
		b.failures++
		if b.failures >= b.cfg.Threshold {
			b.state, b.coolDown = CircuitOpen, b.cfg.CoolDown
			b.until = now.Add(b.coolDown)
		}
	case !probe || b.state != CircuitHalfOpen:
		// a call that started before the circuit opened: the probe decides
	case !failed:
		b.state, b.failures, b.coolDown, b.until = CircuitClosed, 0, 0, time.Time{}
	default:
		b.coolDown = min(2*b.coolDown, b.cfg.MaxCoolDown)
		b.state, b.until = CircuitOpen, now.Add(b.coolDown)
	}
	return b.state
}

// release gives a probe back without an outcome (the call was abandoned at
// shutdown): the next caller may probe at once.
func (b *breaker) release(now time.Time, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe && b.state == CircuitHalfOpen {
		b.until = now
	}
}

// snapshot is the state at now, for metrics and tests.
func (b *breaker) snapshot() (state, failures int, coolDown time.Duration, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state, b.failures, b.coolDown, b.until
}

// circuits holds one breaker per endpoint.
type circuits struct {
	cfg CircuitConfig
	mu  sync.Mutex
	m   map[string]*breaker
}

func (c *circuits) get(endpoint string) *breaker {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*breaker{}
	}
	b, ok := c.m[endpoint]
	if !ok {
		b = newBreaker(c.cfg)
		c.m[endpoint] = b
	}
	return b
}
