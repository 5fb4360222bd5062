package mesh_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
)

func zero() *int { n := 0; return &n }

// validate (a real command) fails once: the task goes back to implement with
// the validator's output in the prompt, then passes.
func TestPipelineGoesBackWithTheValidatorsOutput(t *testing.T) {
	dir := t.TempDir()
	pol := &policy.File{Types: map[string]policy.Type{"go_fix": {Steps: []policy.Step{
		{Name: "implement", OnFail: policy.OnFail{Retry: zero()}},
		{Name: "validate", Run: "command", Dir: dir,
			// fails on its first run, passes after
			Command: []string{"sh", "-c", `if [ -f ran ]; then echo ok; else touch ran; echo "main.go:3:2: x declared and not used"; exit 1; fi`},
			OnFail:  policy.OnFail{Goto: []policy.Goto{{Step: "implement", Max: 3}}}},
	}}}}
	e := newEnv(t, succeed, pol)
	e.start()
	id := e.submit(events.Submit{ID: "pipe-1", Type: "go_fix", Subject: "main.go"})
	all := e.waitEnd(id)
	if got := last(all).Stage; got != events.StageSucceeded {
		t.Fatalf("ended with %s: %v", got, timeline.Stages(all))
	}
	reqs := e.model.Requests()
	if len(reqs) != 2 {
		t.Fatalf("model calls = %d, want 2 (implement twice; validate is a command)", len(reqs))
	}
	second := reqs[1].Messages[1].Content
	if !strings.Contains(second, "step validate failed") || !strings.Contains(second, "main.go:3:2: x declared and not used") {
		t.Fatalf("implement's second prompt lacks the validator output:\n%s", second)
	}
	st := e.state(id)
	var steps []string
	for _, a := range st.History {
		steps = append(steps, a.Step+":"+a.Outcome)
	}
	if got := strings.Join(steps, " "); got != "implement:success validate:failure implement:success validate:success" {
		t.Fatalf("step runs: %s", got)
	}
}

// A pipeline that exhausts its loops is parked, comes back, and after the
// skip budget lands in review as stuck.
func TestPipelineSkipThenStuck(t *testing.T) {
	pol := &policy.File{Types: map[string]policy.Type{"go_fix": {
		Steps: []policy.Step{
			{Name: "implement", OnFail: policy.OnFail{Retry: zero()}},
			{Name: "validate", Run: "command", Command: []string{"sh", "-c", "echo FAIL: TestX; exit 1"},
				OnFail: policy.OnFail{Goto: []policy.Goto{{Step: "implement", Max: 1}}, Final: "skip"}},
		},
		SkipBudget: 2, SkipDelay: policy.Duration(time.Second),
	}}}
	e := newEnv(t, func(int, openaitest.Request) openaitest.Reply {
		return openaitest.Reply{Content: openaitest.Success("write the code")}
	}, pol)
	e.start()
	id := e.submit(events.Submit{ID: "pipe-stuck", Type: "go_fix", Subject: "main.go"})
	all := e.waitEnd(id)
	if got := last(all).Stage; got != "review.stuck" {
		t.Fatalf("ended with %s: %v", got, timeline.Stages(all))
	}
	st := e.state(id)
	if st.Status != events.StatusBlocked || st.Skips != 2 || st.Decision != events.DecisionStuck {
		t.Fatalf("state %s skips %d decision %s", st.Status, st.Skips, st.Decision)
	}
	// three rounds of (implement, validate, implement, validate)
	if n := len(st.History); n != 12 || e.model.Calls() != 6 {
		t.Fatalf("%d step runs, %d model calls; want 12 and 6", n, e.model.Calls())
	}
	if len(e.reviews(events.ReviewStuck)) != 1 {
		t.Fatal("want exactly one stuck record")
	}
}
