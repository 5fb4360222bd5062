package executor_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

const unavailable = `{"error":{"message":"The server is overloaded","type":"server_error"}}`

func TestTransientIsRetriedIdentically(t *testing.T) {
	e := newEnv(t, sequence(status(http.StatusServiceUnavailable, unavailable), ok("fixed it")), policy.Type{}, nil)

	delay := e.handle("t1", 1, testMessages).snooze(t)
	if delay != 500*time.Millisecond { // jitter 0.5 of the first ceiling, 1s
		t.Errorf("snooze %v, want 500ms", delay)
	}
	if st := e.state("t1"); st.TransientRetries != 1 || st.Status != events.StatusRunning {
		t.Errorf("state after the snooze %+v, want running with 1 transient retry", st)
	}

	// the router redelivers the same message after the delay
	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeSuccess || r.TransientRetries != 1 || r.TokensIn != 100 {
		t.Errorf("result %+v, want a success that rode out 1 transient failure", r)
	}
	reqs := e.model.Requests()
	if len(reqs) != 2 || !bytes.Equal(reqs[0].Body, reqs[1].Body) {
		t.Fatalf("%d requests, want 2 with byte-identical bodies:\n%s\n%s", len(reqs), reqs[0].Body, reqs[len(reqs)-1].Body)
	}
	if st := e.state("t1"); st.TransientRetries != 0 {
		t.Errorf("transient count %d after the attempt ended, want it reset", st.TransientRetries)
	}
	if n := e.counter("dispatch_executor_snooze_seconds", map[string]string{"reason": "backoff"}); n != 1 {
		t.Errorf("%v backoff snoozes observed, want 1", n)
	}
	if n := e.counter("dispatch_executor_transient_retries_total", map[string]string{"endpoint": e.model.BaseURL()}); n != 1 {
		t.Errorf("%v transient retries counted for the endpoint, want 1", n)
	}
}

func TestTransientBackoffGrows(t *testing.T) {
	e := newEnv(t, always(status(http.StatusBadGateway, "<html>bad gateway</html>")), policy.Type{TransientBudget: 20},
		func(c *executor.Config) { c.Rand = func() float64 { return 0.999 } })
	want := []time.Duration{999 * time.Millisecond, 1998 * time.Millisecond, 3996 * time.Millisecond, 7992 * time.Millisecond}
	for i, w := range want {
		if d := e.handle("t1", 1, testMessages).snooze(t); d.Round(time.Millisecond) != w {
			t.Errorf("snooze %d: %v, want %v", i+1, d, w)
		}
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	tests := []struct {
		name  string
		reply func() (int, string, string, string)
		want  time.Duration
	}{
		{"seconds", func() (int, string, string, string) {
			return http.StatusTooManyRequests, `{"error":{"message":"Rate limit reached for gpt-4o","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After", "2"
		}, 2 * time.Second},
		{"http date", func() (int, string, string, string) {
			return http.StatusServiceUnavailable, unavailable, "Retry-After", testNow.Add(90 * time.Second).Format(http.TimeFormat)
		}, 90 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, k, v := tt.reply()
			e := newEnv(t, always(status(code, body, k, v)), policy.Type{}, nil)
			if d := e.handle("t1", 1, testMessages).snooze(t); d != tt.want {
				t.Errorf("snooze %v, want Retry-After's %v", d, tt.want)
			}
			if n := e.counter("dispatch_executor_snooze_seconds", map[string]string{"reason": "retry_after"}); n != 1 {
				t.Errorf("%v retry_after snoozes observed, want 1", n)
			}
		})
	}
}

func TestTransientBudgetExhausted(t *testing.T) {
	e := newEnv(t, always(status(http.StatusServiceUnavailable, unavailable)), policy.Type{TransientBudget: 2}, nil)
	for range 2 {
		e.handle("t1", 1, testMessages).snooze(t)
	}
	r := e.handle("t1", 1, testMessages).result(t)
	if r.Outcome != events.OutcomeFailure || r.ErrorClass != events.ErrorClassTransient || r.TransientRetries != 3 {
		t.Errorf("result %+v, want a transient failure after 3 transient errors", r)
	}
	if !strings.HasPrefix(r.Error, "provider unavailable: ") || !strings.Contains(r.Error, "The server is overloaded") {
		t.Errorf("error %q, want provider unavailable with the last error", r.Error)
	}
	if st := e.state("t1"); st.TransientRetries != 0 || len(st.FailedRequests) != 0 {
		t.Errorf("state %+v, want the count reset and nothing banned (a transient error bans nothing)", st)
	}
	if n := e.model.Calls(); n != 3 {
		t.Errorf("%d calls, want 3", n)
	}
}

func TestTransientDefaultBudget(t *testing.T) {
	e := newEnv(t, always(status(http.StatusInternalServerError, unavailable)), policy.Type{},
		func(c *executor.Config) { c.Circuit.Threshold = -1 })
	for range executor.DefaultTransientBudget {
		e.handle("t1", 1, testMessages).snooze(t)
	}
	if r := e.handle("t1", 1, testMessages).result(t); r.ErrorClass != events.ErrorClassTransient {
		t.Errorf("result %+v, want the attempt failed past the default budget", r)
	}
}

func TestTransientWithoutTaskStore(t *testing.T) {
	e := newEnv(t, sequence(status(http.StatusServiceUnavailable, unavailable), status(http.StatusServiceUnavailable, unavailable), ok("a")),
		policy.Type{}, func(c *executor.Config) { c.Tasks = nil })
	if d := e.handle("t1", 1, testMessages).snooze(t); d != 500*time.Millisecond {
		t.Errorf("first snooze %v, want 500ms", d)
	}
	if d := e.handle("t1", 1, testMessages).snooze(t); d != time.Second {
		t.Errorf("second snooze %v, want 1s: the count is kept in memory", d)
	}
	if r := e.handle("t1", 1, testMessages).result(t); r.Outcome != events.OutcomeSuccess || r.TransientRetries != 2 {
		t.Errorf("result %+v, want a success after 2 transient failures", r)
	}
}

func TestCircuitLimitsCallsToAFailingEndpoint(t *testing.T) {
	var healthy atomic.Bool
	e := newEnv(t, func(int, openaitest.Request) openaitest.Reply {
		if healthy.Load() {
			return ok("back")
		}
		return status(http.StatusServiceUnavailable, unavailable)
	}, policy.Type{TransientBudget: 100}, func(c *executor.Config) {
		c.Circuit = executor.CircuitConfig{Threshold: 3, CoolDown: 30 * time.Second, MaxCoolDown: time.Minute}
	})
	handleMany := func(from, n int) (circuitSnoozes int, last time.Duration) {
		for i := from; i < from+n; i++ {
			h := e.handle(fmt.Sprintf("t%d", i), 1, testMessages)
			if errors.Is(h.err, executor.ErrCircuitOpen) {
				circuitSnoozes++
				last = h.snooze(t)
			}
		}
		return circuitSnoozes, last
	}

	// 20 tasks: 3 calls open the circuit, the other 17 are snoozed without a call
	if n, wait := handleMany(0, 20); n != 17 || wait != 30*time.Second {
		t.Errorf("%d circuit snoozes (last %v), want 17 for the whole 30s cool-down", n, wait)
	}
	if calls := e.model.Calls(); calls != 3 {
		t.Fatalf("%d calls, want the threshold, 3", calls)
	}
	e.clock.Advance(10 * time.Second)
	if _, wait := handleMany(20, 1); wait != 20*time.Second {
		t.Errorf("snoozed %v, want the 20s left of the cool-down", wait)
	}

	// cool-down over: one probe, it fails, the cool-down doubles
	e.clock.Advance(20 * time.Second)
	if n, wait := handleMany(21, 10); n != 9 || wait != time.Minute {
		t.Errorf("%d circuit snoozes (last %v), want 9 behind the failed probe, for a 1m cool-down", n, wait)
	}
	if calls := e.model.Calls(); calls != 4 {
		t.Fatalf("%d calls, want 3 + 1 probe", calls)
	}
	if st := e.counter("dispatch_model_circuit_state", map[string]string{"model": "gpt-4o"}); st != executor.CircuitOpen {
		t.Errorf("circuit state gauge %v, want open", st)
	}

	// the endpoint recovers: the next probe closes the circuit
	healthy.Store(true)
	e.clock.Advance(time.Minute)
	if n, _ := handleMany(31, 5); n != 0 {
		t.Errorf("%d circuit snoozes after a successful probe, want 0", n)
	}
	if calls := e.model.Calls(); calls != 4+5 {
		t.Errorf("%d calls, want 4 + 5 after the circuit closed", calls)
	}
}
