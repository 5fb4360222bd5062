package ladder

import (
	"fmt"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Step routing actions.
const (
	ActionNext  = "next"  // go on to the following step
	ActionDone  = "done"  // the last step passed: the task succeeded
	ActionRetry = "retry" // run the failed step again
	ActionGoto  = "goto"  // go back to an earlier step with the error as context
	ActionFail  = "fail"  // loops exhausted, final "fail": a human takes over
	ActionSkip  = "skip"  // loops exhausted, final "skip": park and come back later
)

// Default step policy numbers.
const (
	DefaultStepRetry = 3 // retries of a model step
	DefaultGotoMax   = 3 // times one go-back edge may be taken
)

// Progress is the pipeline's part of a task's state.
type Progress struct {
	Step    string
	Retries map[string]int // retries used per step in the current loop
	Loops   map[string]int // go-backs taken per edge "from>to"
}

// Route is what happens after a step ran.
type Route struct {
	Action string
	// Step is the step to run next (for next, retry and goto).
	Step     string
	Progress Progress
	// Reason explains a fail or skip.
	Reason string
}

// RetryCap is how often a step may be retried: its policy's value, else 0
// for a command step (a deterministic check gives the same answer again)
// and 3 for a model step.
func RetryCap(s policy.Step) int {
	switch {
	case s.OnFail.Retry != nil:
		return max(*s.OnFail.Retry, 0)
	case s.Run == "command":
		return 0
	}
	return DefaultStepRetry
}

func gotoMax(g policy.Goto) int {
	if g.Max > 0 {
		return g.Max
	}
	return DefaultGotoMax
}

// FirstStep is where a pipeline starts ("execute" without one).
func FirstStep(steps []policy.Step) string {
	if len(steps) == 0 {
		return events.StepExecute
	}
	return steps[0].Name
}

// RouteStep decides where a pipeline goes after step p.Step passed or failed.
// Retries reset when the loop that uses them starts again (a go-back resets
// the target and every later step); go-back edges never reset. So the runs of
// one task are bounded by MaxRuns.
func RouteStep(steps []policy.Step, p Progress, success bool) Route {
	i := index(steps, p.Step)
	p = clone(p)
	if i < 0 {
		return Route{Action: ActionFail, Progress: p, Reason: fmt.Sprintf("unknown step %q", p.Step)}
	}
	step := steps[i]
	if success {
		delete(p.Retries, step.Name)
		if i == len(steps)-1 {
			return Route{Action: ActionDone, Progress: p}
		}
		p.Step = steps[i+1].Name
		return Route{Action: ActionNext, Step: p.Step, Progress: p}
	}
	if p.Retries[step.Name] < RetryCap(step) {
		p.Retries[step.Name]++
		return Route{Action: ActionRetry, Step: step.Name, Progress: p}
	}
	for _, g := range step.OnFail.Goto {
		t := index(steps, g.Step)
		edge := step.Name + ">" + g.Step
		if t < 0 || p.Loops[edge] >= gotoMax(g) {
			continue
		}
		p.Loops[edge]++
		for _, later := range steps[t:] {
			delete(p.Retries, later.Name)
		}
		p.Step = g.Step
		return Route{Action: ActionGoto, Step: g.Step, Progress: p}
	}
	reason := fmt.Sprintf("step %s failed and its retries and go-backs are exhausted", step.Name)
	if step.OnFail.Final == "skip" {
		return Route{Action: ActionSkip, Progress: p, Reason: reason}
	}
	return Route{Action: ActionFail, Progress: p, Reason: reason}
}

// MaxRuns bounds the step runs of one pass through a pipeline (until done,
// fail or skip): every go-back edge can be taken a bounded number of times,
// and between two go-backs each step runs at most its retry cap + 1 times.
func MaxRuns(steps []policy.Step) int {
	loops, perLoop := 0, 0
	for _, s := range steps {
		perLoop += RetryCap(s) + 1
		for _, g := range s.OnFail.Goto {
			loops += gotoMax(g)
		}
	}
	return (loops + 1) * perLoop
}

func index(steps []policy.Step, name string) int {
	for i, s := range steps {
		if s.Name == name {
			return i
		}
	}
	return -1
}

func clone(p Progress) Progress {
	c := Progress{Step: p.Step, Retries: map[string]int{}, Loops: map[string]int{}}
	for k, v := range p.Retries {
		c.Retries[k] = v
	}
	for k, v := range p.Loops {
		c.Loops[k] = v
	}
	return c
}
