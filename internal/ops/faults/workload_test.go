package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/faults"
	"github.com/dispatchmesh/dispatchmesh/services/prompt"
)

// The task types of the workload: four gated ones, each new (their first
// tasks are canaries, the others wait), and one exempt; one of them
// (verifiedType) has a verifier.
var taskTypes = []string{"css_fix", "docs_fix", "test_fix", "lint_fix", "triage_fix"}

// maxRetries is the policy's attempt limit: a hopeless task makes 4 attempts.
const maxRetries = 4

// planMix is how often each plan comes up: mostly successes, billed
// failures so ladders climb, deterministic 400s, hopeless tasks that end
// in a handoff, auth failures that go to a human at once, and transient
// 503s (Retry-After: 1) before the first answer.
var planMix = []struct {
	weight int
	plan   faults.Plan
}{
	{38, faults.Plan{Answers: "S"}},
	{14, faults.Plan{Answers: "FS"}},
	{8, faults.Plan{Answers: "DS"}},
	{8, faults.Plan{Answers: "FFS"}},
	{4, faults.Plan{Answers: "FDFS"}},
	{10, faults.Plan{Answers: "F"}},
	{3, faults.Plan{Answers: "A"}},
	{3, faults.Plan{Answers: "FA"}},
	{6, faults.Plan{Answers: "S", Transient: 1}},
	{6, faults.Plan{Answers: "FS", Transient: 2}},
}

type task struct {
	id, typ, subject string
	plan             faults.Plan
}

// workload is the tasks of one run, with their plans.
type workload struct {
	tasks []task
	plans map[string]faults.Plan
}

// newWorkload makes n tasks named <prefix>-<i>, their types in turn, three
// tasks per (type, subject) (so prompts carry the subject's history), plans
// drawn from planMix with seed.
func newWorkload(prefix string, n int, seed uint64) *workload {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	total := 0
	for _, m := range planMix {
		total += m.weight
	}
	w := &workload{plans: map[string]faults.Plan{}}
	for i := range n {
		typ := taskTypes[i%len(taskTypes)]
		pick := r.IntN(total)
		var plan faults.Plan
		for _, m := range planMix {
			if pick < m.weight {
				plan = m.plan
				break
			}
			pick -= m.weight
		}
		t := task{
			id: fmt.Sprintf("%s-%04d", prefix, i), typ: typ,
			subject: fmt.Sprintf("src/%s/file%03d.go", typ, i/len(taskTypes)/3), plan: plan,
		}
		w.tasks = append(w.tasks, t)
		w.plans[t.id] = plan
	}
	return w
}

func (w *workload) plan(id string) (faults.Plan, bool) {
	p, ok := w.plans[id]
	return p, ok
}

// verifiedType is the workload's one type with a verifier: a command that
// always answers "the problem exists" (true), so every pass of it goes
// through the verifier — killed and restarted with the others — while the
// other types' passes go straight to the gate.
const verifiedType = "lint_fix"

// writePolicy writes the policy file the mesh runs with: the attempt
// limit, a template that starts every prompt with the run mark, for two
// types a daily budget no run reaches — the spend counters count only what
// a budget caps: tokens and cost for triage_fix, tokens for docs_fix — and
// verifiedType's verifier.
func writePolicy(t *testing.T) (path string, src *policy.Source) {
	t.Helper()
	exists, err := exec.LookPath("true")
	if err != nil {
		t.Fatalf("the verifier's command: %v", err)
	}
	data, err := json.MarshalIndent(map[string]any{
		"defaults": map[string]any{"max_retries": maxRetries, "template": runMark + prompt.DefaultTemplate},
		"types": map[string]any{
			"triage_fix": map[string]any{"daily_budget": map[string]any{"tokens": 1_000_000_000, "cost": 1_000_000}},
			"docs_fix":   map[string]any{"daily_budget": map[string]any{"tokens": 1_000_000_000}},
			verifiedType: map[string]any{"verifier": map[string]any{"kind": policy.VerifierCommand, "command": []string{exists}}},
		},
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	f, err := policy.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, policy.Static(f)
}

// submitter publishes the workload as any client does
// (dispatch.submit.<type>, Msg-Id submit:<id>), retrying each until the
// stream acknowledges it: a burst of the first tenth at once (new types:
// a few canaries go, the others wait), the rest at a steady pace.
type submitter struct {
	done  chan struct{}
	mu    sync.Mutex
	acked map[string]faults.Plan
	err   error
}

func submit(ctx context.Context, c *client.Client, w *workload, over time.Duration) *submitter {
	s := &submitter{done: make(chan struct{}), acked: map[string]faults.Plan{}}
	go func() {
		defer close(s.done)
		start := time.Now()
		burst := len(w.tasks) / 10
		for i, t := range w.tasks {
			at := over * time.Duration(max(i-burst, 0)) / time.Duration(len(w.tasks)-burst)
			if wait := time.Until(start.Add(at)); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return
				}
			}
			task := events.Submit{ID: t.id, Type: t.typ, Subject: t.subject,
				Payload: json.RawMessage(fmt.Sprintf(`{"issue":"fault suite task %d"}`, i))}
			for {
				// Through the submit API, as the client user does: the same
				// id submitted again (a lost answer) makes one task.
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := c.Submit(pctx, task)
				cancel()
				if err == nil {
					s.mu.Lock()
					s.acked[t.id] = t.plan
					s.mu.Unlock()
					break
				}
				if ctx.Err() != nil || time.Since(start) > over+patience {
					s.mu.Lock()
					s.err = fmt.Errorf("submit %s: %w", t.id, err)
					s.mu.Unlock()
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	return s
}

// wait waits for every task to be acknowledged and returns them.
func (s *submitter) wait(t *testing.T) map[string]faults.Plan {
	t.Helper()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.acked
}

// count is how many tasks were acknowledged so far.
func (s *submitter) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked)
}
