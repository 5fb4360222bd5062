package ladder_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

func ptr(n int) *int { return &n }

// The four-step pipeline of SPEC §7.
var spec7 = []policy.Step{
	{Name: "plan", OnFail: policy.OnFail{Retry: ptr(2), Final: "fail"}},
	{Name: "implement", OnFail: policy.OnFail{Retry: ptr(3), Goto: []policy.Goto{{Step: "plan", Max: 2}}}},
	{Name: "validate", Run: "command", Command: []string{"go", "vet", "./..."}, OnFail: policy.OnFail{Retry: ptr(0), Goto: []policy.Goto{{Step: "implement", Max: 3}}}},
	{Name: "test", Run: "command", OnFail: policy.OnFail{Retry: ptr(1), Goto: []policy.Goto{{Step: "implement", Max: 3}, {Step: "plan"}}}},
}

// walk runs outcomes (true = pass) through the pipeline and returns the
// route actions, joined.
func walk(steps []policy.Step, outcomes ...bool) (string, ladder.Route) {
	p := ladder.Progress{Step: ladder.FirstStep(steps)}
	var trace []string
	var r ladder.Route
	for _, ok := range outcomes {
		r = ladder.RouteStep(steps, p, ok)
		trace = append(trace, p.Step+":"+r.Action)
		p = r.Progress
	}
	return strings.Join(trace, " "), r
}

func TestRouteStep(t *testing.T) {
	cases := []struct {
		name     string
		outcomes []bool
		want     string
	}{
		{"all pass", []bool{true, true, true, true}, "plan:next implement:next validate:next test:done"},
		{"validate fails: straight back to implement", []bool{true, true, false, true, true, true}, "plan:next implement:next validate:goto implement:next validate:next test:done"},
		{"implement retries 3 then goes back to plan", []bool{true, false, false, false, false, true}, "plan:next implement:retry implement:retry implement:retry implement:goto plan:next"},
		{"plan retries 2 then fails the task", []bool{false, false, false}, "plan:retry plan:retry plan:fail"},
		{"test retries once, then back to implement", []bool{true, true, true, false, false}, "plan:next implement:next validate:next test:retry test:goto"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, _ := walk(spec7, c.outcomes...); got != c.want {
				t.Fatalf("\n got %s\nwant %s", got, c.want)
			}
		})
	}
}

func TestRouteStepNestedFallback(t *testing.T) {
	// test keeps failing: 3 loops back to implement, then back to plan.
	var outcomes []bool
	outcomes = append(outcomes, true, true, true) // plan, implement, validate
	for range 3 {
		outcomes = append(outcomes, false, false, true, true) // test fails twice → implement → validate
	}
	outcomes = append(outcomes, false, false) // test fails twice more: implement edge exhausted
	trace, last := walk(spec7, outcomes...)
	if last.Action != ladder.ActionGoto || last.Step != "plan" {
		t.Fatalf("after the implement loops: %s → %s %s\n%s", last.Action, last.Action, last.Step, trace)
	}
	if last.Progress.Loops["test>implement"] != 3 || last.Progress.Loops["test>plan"] != 1 {
		t.Fatalf("loops = %v", last.Progress.Loops)
	}
}

func TestRouteStepSkip(t *testing.T) {
	steps := []policy.Step{
		{Name: "implement", OnFail: policy.OnFail{Retry: ptr(0)}},
		{Name: "validate", Run: "command", OnFail: policy.OnFail{Goto: []policy.Goto{{Step: "implement", Max: 1}}, Final: "skip"}},
	}
	_, last := walk(steps, true, false, true, false)
	if last.Action != ladder.ActionSkip || !strings.Contains(last.Reason, "validate") {
		t.Fatalf("route = %+v", last)
	}
}

func TestRetryCapDefaults(t *testing.T) {
	if got := ladder.RetryCap(policy.Step{Name: "m"}); got != 3 {
		t.Errorf("model step retry cap %d, want 3", got)
	}
	if got := ladder.RetryCap(policy.Step{Name: "c", Run: "command"}); got != 0 {
		t.Errorf("command step retry cap %d, want 0", got)
	}
}

// Property: for random pipelines and random outcomes, a pass through the
// pipeline always ends (done, fail or skip) within MaxRuns step runs.
func TestPipelineAlwaysEnds(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		n := 1 + r.IntN(5)
		steps := make([]policy.Step, n)
		for i := range steps {
			steps[i].Name = string(rune('a' + i))
			if r.IntN(2) == 0 {
				steps[i].OnFail.Retry = ptr(r.IntN(4))
			}
			if r.IntN(3) == 0 {
				steps[i].Run = "command"
			}
			for g := 0; g < i && r.IntN(2) == 0; g++ {
				steps[i].OnFail.Goto = append(steps[i].OnFail.Goto, policy.Goto{Step: steps[r.IntN(i)].Name, Max: r.IntN(4)})
			}
		}
		bound := ladder.MaxRuns(steps)
		p := ladder.Progress{Step: ladder.FirstStep(steps)}
		successRate := r.Float64()
		for runs := 1; ; runs++ {
			if runs > bound {
				t.Fatalf("more than MaxRuns=%d step runs for %+v", bound, steps)
			}
			route := ladder.RouteStep(steps, p, r.Float64() < successRate)
			if route.Action == ladder.ActionDone || route.Action == ladder.ActionFail || route.Action == ladder.ActionSkip {
				break
			}
			p = route.Progress
		}
	}
}
