package spendbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/services/prompt"
)

// ask sends one chat completion with the given user message.
func ask(t *testing.T, m *executor.OpenAI, user string) (executor.Response, error) {
	t.Helper()
	return m.Complete(context.Background(), executor.Request{
		Model: "gpt-4o-mini", ResponseFormat: executor.ResponseFormatJSON,
		Messages: []executor.Message{{Role: "system", Content: "sys"}, {Role: "user", Content: user}},
	})
}

func status(err error) int {
	var pe *executor.ProviderError
	if errors.As(err, &pe) {
		return pe.StatusCode
	}
	return 0
}

// The server finds the ticket however the prompt escaped the payload, bills
// like the real API, and answers each scenario from the request and the
// ticket's earlier calls only.
func TestServerScenarios(t *testing.T) {
	srv, err := StartServer(-1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	m := executor.NewOpenAI(executor.OpenAIConfig{BaseURL: srv.BaseURL(), APIKey: "k"})
	payload := func(sc, ticket string) string {
		return fmt.Sprintf(`<payload>{"scenario":"%s","ticket":"%s","context":"a b c"}</payload>`, sc, ticket)
	}

	// healthy, with the payload XML-escaped: billed characters / 4
	user := strings.ReplaceAll(payload(Healthy, "h-1"), `"`, "&#34;")
	resp, err := ask(t, m, user)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := executor.ParseResult(resp.Content); err != nil || r.Status != events.OutcomeSuccess {
		t.Fatalf("healthy: %q %v", resp.Content, err)
	}
	if want := tokens(len("sys") + len(user)); resp.TokensIn != want || resp.TokensOut != tokens(len(resp.Content)) {
		t.Errorf("usage %d/%d, want %d/%d", resp.TokensIn, resp.TokensOut, want, tokens(len(resp.Content)))
	}

	// fixable: 400 naming the fix, free; the request carrying it succeeds
	_, err = ask(t, m, payload(Fixable, "f-1"))
	if status(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "FIX-f-1") {
		t.Fatalf("fixable first call: %v", err)
	}
	if _, err := ask(t, m, payload(Fixable, "f-1")+"<last_error>use a class selector [FIX-f-1]</last_error>"); err != nil {
		t.Fatalf("fixable with the fix: %v", err)
	}

	// history: a billed failure naming a hint; the request carrying it succeeds
	resp, err = ask(t, m, payload(History, "y-1"))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := executor.ParseResult(resp.Content)
	if r.Status != events.OutcomeFailure || !strings.Contains(r.Summary, "HINT-y-1") {
		t.Fatalf("history first call: %q", resp.Content)
	}
	resp, _ = ask(t, m, payload(History, "y-1")+"<previous_attempts>"+r.Summary+"</previous_attempts>")
	if r, _ := executor.ParseResult(resp.Content); r.Status != events.OutcomeSuccess {
		t.Fatalf("history with the hint: %q", resp.Content)
	}

	// pivot: a billed failure until the request lists its approach as a dead end
	resp, err = ask(t, m, payload(Pivot, "p-1"))
	if err != nil {
		t.Fatal(err)
	}
	r, _ = executor.ParseResult(resp.Content)
	if r.Status != events.OutcomeFailure || !strings.Contains(r.Approach, "PIVOT-p-1") {
		t.Fatalf("pivot first call: %q", resp.Content)
	}
	resp, _ = ask(t, m, payload(Pivot, "p-1")+"<previous_attempts>"+r.Approach+"</previous_attempts>")
	if r, _ := executor.ParseResult(resp.Content); r.Status != events.OutcomeFailure {
		t.Fatalf("pivot refined without a dead end: %q", resp.Content)
	}
	resp, _ = ask(t, m, payload(Pivot, "p-1")+"<dead_ends><dead_end>"+r.Approach+"</dead_end></dead_ends>")
	if r, _ := executor.ParseResult(resp.Content); r.Status != events.OutcomeSuccess {
		t.Fatalf("pivot with the dead end: %q", resp.Content)
	}

	// rate limited: a transient 429 with Retry-After, then success
	_, err = ask(t, m, payload(RateLimited, "r-1"))
	if c := executor.Classify(err, executor.Rules{}); c.Class != events.ErrorClassTransient || c.RetryAfter != time.Second {
		t.Fatalf("rate limited: %v classified %+v", err, c)
	}
	if _, err := ask(t, m, payload(RateLimited, "r-1")); err != nil {
		t.Fatal(err)
	}

	// bad key and quota: the classes that go straight to a human
	_, err = ask(t, m, payload(BadKey, "b-1"))
	if c := executor.Classify(err, executor.Rules{}); c.Class != events.ErrorClassAuth {
		t.Fatalf("bad key: %v classified %+v", err, c)
	}
	_, err = ask(t, m, payload(Quota, "q-1"))
	if c := executor.Classify(err, executor.Rules{}); c.Class != events.ErrorClassQuota {
		t.Fatalf("quota: %v classified %+v", err, c)
	}

	// hopeless: billed failures whose approach changes every call
	var approaches []string
	for range 2 {
		resp, err := ask(t, m, payload(Hopeless, "x-1"))
		if err != nil {
			t.Fatal(err)
		}
		r, _ := executor.ParseResult(resp.Content)
		if r.Status != events.OutcomeFailure {
			t.Fatalf("hopeless: %q", resp.Content)
		}
		approaches = append(approaches, r.Approach)
	}
	if approaches[0] == approaches[1] {
		t.Errorf("hopeless repeats its approach %q", approaches[0])
	}

	// no ticket: a free 400, not attributed to any task
	if _, err := ask(t, m, "nothing here"); status(err) != http.StatusBadRequest {
		t.Fatalf("no ticket: %v", err)
	}

	led := srv.Ledger()
	if len(srv.Unassigned()) != 1 {
		t.Errorf("unassigned calls: %d, want 1", len(srv.Unassigned()))
	}
	for ticket, calls := range led {
		for _, c := range calls {
			if !c.Billed() && c.Tokens() != 0 {
				t.Errorf("%s: an error answer billed %d tokens", ticket, c.Tokens())
			}
		}
	}
	if fc := led["f-1"]; len(fc) != 2 || !fc[0].Deterministic() || fc[0].Hash == fc[1].Hash {
		t.Errorf("fixable ledger: %+v", fc)
	}
	if rc := led["r-1"]; len(rc) != 2 || !rc[0].Transient() || rc[0].Hash != rc[1].Hash {
		t.Errorf("rate-limited ledger: %+v", rc)
	}
}

// The workload follows its mix, is reproducible, and every payload names
// its ticket in a prompt rendered by the default template.
func TestGenerate(t *testing.T) {
	w := Workload{Tasks: 300, Seed: 3, ContextTokens: 50}
	a, b := Generate(w), Generate(w)
	if len(a) != 300 {
		t.Fatalf("%d tasks", len(a))
	}
	count := map[string]int{}
	ids := map[string]bool{}
	subjects := map[string]bool{}
	for i, task := range a {
		if task.ID != b[i].ID || task.Subject != b[i].Subject || string(task.Payload) != string(b[i].Payload) {
			t.Fatalf("task %d differs between two generations", i)
		}
		count[task.Scenario]++
		ids[task.ID] = true
		subjects[task.Scenario+" "+task.Subject] = true
		if !events.ValidID(task.ID) || !events.ValidType(task.Scenario) {
			t.Fatalf("invalid id or type: %+v", task)
		}
	}
	if len(ids) != 300 {
		t.Errorf("%d distinct ids", len(ids))
	}
	if len(subjects) < 200 || len(subjects) == 300 {
		t.Errorf("%d distinct subjects of 300: want mostly distinct, some repeats", len(subjects))
	}
	for _, s := range DefaultMix {
		if want := int(s.Percent * 3); count[s.Scenario] != want {
			t.Errorf("%s: %d tasks, want %d", s.Scenario, count[s.Scenario], want)
		}
	}

	tmpl, err := prompt.Parse(prompt.DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	task := a[0]
	msgs, err := prompt.Build(tmpl, prompt.NewData(events.Base{
		Task: events.Task{ID: task.ID, Type: task.Scenario, Subject: task.Subject, Payload: task.Payload},
		Run:  events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine},
	}, nil))
	if err != nil {
		t.Fatal(err)
	}
	var contents []string
	for _, m := range msgs {
		contents = append(contents, m.Content)
	}
	if sc, ticket := identify(contents); sc != task.Scenario || ticket != task.ID {
		t.Errorf("identify found %q %q in the rendered prompt, want %q %q", sc, ticket, task.Scenario, task.ID)
	}
}

// A small workload through the mesh and the naive loop, in both delivery
// modes: every task is accounted for in both runs, every call is attributed
// to a task, and the mesh keeps its error discipline. These are correctness
// properties; the economic targets are reported, not asserted.
func TestAccounting(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the mesh end to end")
	}
	for _, mode := range []string{ModeOnce, ModeSteady} {
		t.Run(mode, func(t *testing.T) {
			cfg := Config{
				Mode: mode, Rate: 20,
				Workload: Workload{Tasks: 40, ContextTokens: 30, Seed: 11},
				Wait:     2 * time.Minute,
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			c, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			tasks := Generate(cfg.withDefaults().Workload)
			for _, f := range []Figures{c.Mesh, c.Loop} {
				checkAccounted(t, f, tasks)
			}
			m, l := c.Mesh, c.Loop
			if m.Poison != 0 {
				t.Errorf("mesh: %d tasks poisoned", m.Poison)
			}
			if m.IdenticalAfterDeterministic != 0 {
				t.Errorf("mesh: %d identical requests after a deterministic error", m.IdenticalAfterDeterministic)
			}
			if m.CallsAfterAuthOrQuota != 0 {
				t.Errorf("mesh: %d calls after an auth or quota failure", m.CallsAfterAuthOrQuota)
			}
			// The detectors work: the loop resends the same request.
			if l.IdenticalAfterDeterministic == 0 || l.CallsAfterAuthOrQuota == 0 {
				t.Errorf("loop: %d identical after deterministic, %d after auth/quota: the workload should make both positive",
					l.IdenticalAfterDeterministic, l.CallsAfterAuthOrQuota)
			}
			for _, r := range l.Results {
				if r.Calls < 1 || r.Calls > 3 {
					t.Errorf("loop task %s made %d calls, want 1-3", r.ID, r.Calls)
				}
			}
			var out strings.Builder
			if err := Summarize(cfg, []Comparison{c}).Report(&out); err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + out.String())
		})
	}
}

// checkAccounted checks that every task of the workload has exactly one end
// in f and that the per-task and per-scenario figures add up to the totals.
func checkAccounted(t *testing.T, f Figures, tasks []Task) {
	t.Helper()
	if len(f.Results) != len(tasks) || f.Tasks != len(tasks) {
		t.Fatalf("%s: %d results, %d counted, for %d tasks", f.Runner, len(f.Results), f.Tasks, len(tasks))
	}
	if f.NotEnded != 0 || f.BadEndRecords != 0 {
		t.Errorf("%s: %d tasks not ended, %d without exactly one end record; statuses %v", f.Runner, f.NotEnded, f.BadEndRecords, f.Statuses)
	}
	if f.UnassignedCalls != 0 {
		t.Errorf("%s: %d calls named no task", f.Runner, f.UnassignedCalls)
	}
	if f.ResolvedWithoutSuccess != 0 {
		t.Errorf("%s: %d tasks resolved without a success answer", f.Runner, f.ResolvedWithoutSuccess)
	}
	var sum Tally
	for i, r := range f.Results {
		if r.ID != tasks[i].ID {
			t.Fatalf("%s: result %d is %s, want %s", f.Runner, i, r.ID, tasks[i].ID)
		}
		// Every task settles: the mesh ends it, or holds it for its
		// type's trust (held is settled, not terminal: SPEC §2).
		held := f.Runner == RunnerMesh && events.Status(r.Status) == events.StatusHeld
		if !held && (!r.Ended || (f.Runner == RunnerMesh && !events.Terminal(events.Status(r.Status)))) {
			t.Errorf("%s: task %s ended %q", f.Runner, r.ID, r.Status)
		}
		sum.Tasks++
		sum.Calls += r.Calls
		sum.Tokens += r.Tokens
		sum.Attempts += r.Attempts
		if r.Resolved {
			sum.Resolved++
		} else {
			sum.WastedTokens += r.Tokens
		}
	}
	var byScenario Tally
	for _, s := range f.ByScenario {
		byScenario.add(s)
	}
	for _, got := range []Tally{sum, byScenario} {
		if got.Tasks != f.Tasks || got.Calls != f.Calls || got.Tokens != f.Tokens || got.Attempts != f.Attempts ||
			got.Resolved != f.Resolved || got.WastedTokens != f.WastedTokens {
			t.Errorf("%s: parts %+v do not add up to the totals %+v", f.Runner, got, f.Tally)
		}
	}
	n := 0
	for _, v := range f.Statuses {
		n += v
	}
	if n != len(tasks) {
		t.Errorf("%s: statuses %v count %d tasks, want %d", f.Runner, f.Statuses, n, len(tasks))
	}
}

var (
	benchTasks   = flag.Int("spend.tasks", 0, "BenchmarkSpend: tasks per run (default: the workload's, 300 for default)")
	benchContext = flag.Int("spend.context", 1000, "BenchmarkSpend: filler context per prompt, in tokens")
	benchRate    = flag.Float64("spend.rate", 10, "BenchmarkSpend: steady delivery rate, tasks/s")
	benchShape   = flag.String("spend.workload", ShapeDefault, "BenchmarkSpend: workload shape (default, steady, batch, longtail, regression)")
)

// BenchmarkSpend runs the workload through the mesh and the naive loop, in
// the workload shape's delivery modes (default: all at once and at a
// steady rate), once per b.N, and reports the ratios the targets are
// stated in (means over b.N) and the whole report in the log:
//
//	go test -run '^$' -bench Spend -benchtime 1x ./internal/bench/spendbench
//	go test -run '^$' -bench Spend -benchtime 1x ./internal/bench/spendbench -args -spend.tasks 100
//	go test -run '^$' -bench Spend -benchtime 1x ./internal/bench/spendbench -args -spend.workload longtail
func BenchmarkSpend(b *testing.B) {
	shape, ok := LookupShape(*benchShape)
	if !ok {
		b.Fatalf("-spend.workload %q: want one of %v", *benchShape, ShapeNames())
	}
	cfg := Config{Workload: Workload{Shape: shape.Name, Tasks: *benchTasks, ContextTokens: *benchContext}, Rate: *benchRate}
	var runs []Comparison
	for i := range b.N {
		for _, mode := range shape.Modes {
			c := cfg
			c.Mode = mode
			c.Workload.Seed = uint64(i + 1)
			r, err := Run(context.Background(), c)
			if err != nil {
				b.Fatal(err)
			}
			runs = append(runs, r)
		}
	}
	b.StopTimer()
	mean := func(mode string, get func(Comparison) float64) float64 {
		sum, n := 0.0, 0
		for _, r := range runs {
			if v := get(r); r.Mode == mode && !Ratio(v).Defined() {
				continue
			} else if r.Mode == mode {
				sum += v
				n++
			}
		}
		if n == 0 {
			return 0
		}
		return sum / float64(n)
	}
	for _, mode := range shape.Modes {
		b.ReportMetric(mean(mode, func(c Comparison) float64 { return float64(c.TokensPerResolved) }), "tpr-ratio-"+mode)
		b.ReportMetric(mean(mode, func(c Comparison) float64 { return float64(c.WastedTokens) }), "wasted-ratio-"+mode)
		b.ReportMetric(mean(mode, func(c Comparison) float64 { return float64(c.Mesh.RetrySuccessRate) }), "retry-ok-"+mode)
		b.ReportMetric(mean(mode, func(c Comparison) float64 { return float64(c.Mesh.Resolved - c.Loop.Resolved) }), "resolved-vs-loop-"+mode)
		b.ReportMetric(mean(mode, func(c Comparison) float64 { return float64(c.Mesh.SolvableUnresolved) }), "solvable-unresolved-"+mode)
	}
	var out strings.Builder
	if err := Summarize(cfg, runs).Report(&out); err != nil {
		b.Fatal(err)
	}
	b.Log("\n" + out.String())
}
