package executor_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

func simulate(t *testing.T, m executor.Simulated, id string, attempt int) executor.Response {
	t.Helper()
	resp, err := m.Complete(context.Background(), executor.Request{
		Model: "gpt-4o", Messages: executor.PromptMessages(testMessages), TaskType: "css_fix", TaskID: id, Attempt: attempt,
	})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return resp
}

func rate(r float64) func(string) float64 { return func(string) float64 { return r } }

func TestSimulatedDeterministic(t *testing.T) {
	m := executor.Simulated{Rate: rate(0.5)}
	for i := range 20 {
		id := fmt.Sprintf("task-%d", i)
		a, b := simulate(t, m, id, 3), simulate(t, m, id, 3)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two answers differ:\n%+v\n%+v", id, a, b)
		}
	}
}

func TestSimulatedAnswer(t *testing.T) {
	for _, r := range []float64{0, 1} {
		resp := simulate(t, executor.Simulated{Rate: rate(r)}, "t1", 4)
		if !resp.Simulated || resp.Model != executor.SimulatedModelName {
			t.Errorf("rate %v: response %+v, want Simulated and model %q", r, resp, executor.SimulatedModelName)
		}
		res, err := executor.ParseResult(resp.Content)
		if err != nil {
			t.Fatalf("rate %v: content does not parse: %v", r, err)
		}
		if res.Approach != "simulated approach for attempt 4" || !strings.Contains(res.Summary, "SIMULATED") {
			t.Errorf("rate %v: result %+v, want the attempt's approach and a summary saying it is simulated", r, res)
		}
		in := 0
		for _, m := range testMessages {
			in += len(m.Content)
		}
		if resp.TokensIn != in/4 || resp.TokensOut != len(resp.Content)/4 {
			t.Errorf("rate %v: tokens %d/%d, want %d/%d", r, resp.TokensIn, resp.TokensOut, in/4, len(resp.Content)/4)
		}
	}
}

func TestSimulatedRates(t *testing.T) {
	const n = 1000
	tests := []struct {
		name     string
		model    executor.Simulated
		min, max int // successes out of n
	}{
		{"nil rate always succeeds", executor.Simulated{}, n, n},
		{"rate 1 always succeeds", executor.Simulated{Rate: rate(1)}, n, n},
		{"rate 0 always fails", executor.Simulated{Rate: rate(0)}, 0, 0},
		{"rate 0.5 about half", executor.Simulated{Rate: rate(0.5)}, 400, 600},
		{"rate from policy", executor.Simulated{Rate: executor.RateFromPolicy(policy.Static(&policy.File{
			Types: map[string]policy.Type{"css_fix": {SimulatedSuccessRate: ptr(0.0)}},
		}))}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok := 0
			for i := range n {
				res, err := executor.ParseResult(simulate(t, tt.model, fmt.Sprintf("task-%d", i), 1).Content)
				if err != nil {
					t.Fatal(err)
				}
				if res.Status == events.OutcomeSuccess {
					ok++
				}
			}
			if ok < tt.min || ok > tt.max {
				t.Errorf("%d successes out of %d, want within [%d, %d]", ok, n, tt.min, tt.max)
			}
		})
	}
}

func TestSimulatedHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (executor.Simulated{}).Complete(ctx, executor.Request{TaskID: "t"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Complete on a cancelled context: %v, want context.Canceled", err)
	}
}

func TestHandleSimulated(t *testing.T) {
	s, logs := newService(t, executor.Config{Model: executor.Simulated{Rate: rate(0)}, Prices: prices})
	// The prompt names a priced model: the simulated answer still costs nothing.
	outs, err := s.Handle(context.Background(), prompted(t, "t1", "css_fix", "gpt-4o", 2))
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	r := executed(t, "t1", 2, outs).Result
	if !r.Simulated || r.Model != "simulated" || r.Outcome != events.OutcomeFailure ||
		r.ErrorClass != events.ErrorClassTask || r.Cost != 0 || r.TokensIn == 0 {
		t.Errorf("result %+v, want a simulated task failure with estimated tokens and no cost", r)
	}
	if !strings.Contains(logs.String(), "model=simulated") {
		t.Errorf("log %q does not say model=simulated", logs.String())
	}
}

func ptr[T any](v T) *T { return &v }
