package mesh_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/metricstest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// recordingRegistry registers on a real registry and remembers every
// collector, so a test can list every metric the services export, observed
// or not.
type recordingRegistry struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recordingRegistry) Register(c prometheus.Collector) error {
	err := r.Registry.Register(c)
	if err == nil {
		r.collectors = append(r.collectors, c)
	}
	return err
}

func (r *recordingRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([a-z0-9_]+)"`)

// names is every metric name the registered collectors describe.
func (r *recordingRegistry) names() []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range r.collectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	var names []string
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil && !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	return names
}

// routedModel answers each task type from its own model: sim_fix from the
// built-in simulated model; slow_fix never — its call waits until the
// task is cancelled (started says it began); every other type from the
// fake OpenAI endpoint.
type routedModel struct {
	openai  executor.Model
	started chan string
}

func (m routedModel) Complete(ctx context.Context, req executor.Request) (executor.Response, error) {
	switch req.TaskType {
	case "sim_fix":
		return executor.Simulated{}.Complete(ctx, req)
	case "slow_fix":
		m.started <- req.TaskID
		<-ctx.Done()
		return executor.Response{}, ctx.Err()
	}
	return m.openai.Complete(ctx, req)
}

// A price that makes one call of the fake endpoint (100 tokens in, 50 out)
// cost exactly $2.
var pricedModel = executor.Price{InputPerMTok: 10_000, OutputPerMTok: 20_000}

// A scripted run, one task at a time, in which every counter holds exactly
// what happened:
//
//	ok_fix      10 successes seeded: trusted; 3 tasks succeed on a priced model ($2 a call)
//	sim_fix     the simulated model (model="simulated", cost 0): succeeds
//	triage_fix  exempt: succeeds
//	bad_fix     fails twice: blocked by the recorder (max_retries 2)
//	stale_fix   its verifier says the problem is gone: cancelled by the verifier
//	slow_fix    cancelled by a human while its model call runs
//	flaky_fix   a 503 first (a snooze: one redelivery at the executor), then succeeds
//	doomed_fix  10 failed tasks seeded: the first task is held (trust), the
//	            second goes as a probe (probe after 1 block) and succeeds,
//	            which re-opens the type: the first is re-admitted and succeeds
//	budget_fix  daily budget 100 tokens: the first task (150) succeeds, the
//	            next two are gated (budget); a human rejects one and
//	            requeues the other (reviewed), which succeeds
func TestMetricsOfAScriptedRun(t *testing.T) {
	var flaky atomic.Int32
	e := newEnv(t, func(_ int, req openaitest.Request) openaitest.Reply {
		user := req.Messages[1].Content
		switch {
		case strings.Contains(user, `type="bad_fix"`):
			return openaitest.Reply{Content: openaitest.Failure("an idea", "no")}
		case strings.Contains(user, `type="flaky_fix"`) && flaky.Add(1) == 1:
			return openaitest.Reply{Status: 503, Body: `{"error":{"message":"overloaded","type":"server_error"}}`}
		}
		return openaitest.Reply{Content: openaitest.Success("the fix")}
	}, &policy.File{Types: map[string]policy.Type{
		"ok_fix":     {Model: "priced-model"},
		"bad_fix":    {MaxRetries: 2},
		"stale_fix":  {Verifier: &policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"sh", "-c", "exit 1"}}},
		"budget_fix": {DailyBudget: &policy.Budget{Tokens: 100}},
		"doomed_fix": {ProbeInterval: policy.Duration(2 * time.Hour)}, // its held task waits for the new task's probe
	}})
	ctx := context.Background()
	if _, err := services.Provision(ctx, e.srv.JS, services.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	seed := func(typ string, n int, success bool) {
		for i := range n {
			m, err := trust.OutcomeMsg(typ, trust.Outcome{Key: fmt.Sprintf("seed-%s-%d", typ, i), Success: success, End: true, At: time.Now().Add(-time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.srv.JS.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	seed("ok_fix", 10, true)
	seed("doomed_fix", 10, false)

	reg := &recordingRegistry{Registry: prometheus.NewPedanticRegistry()}
	started := make(chan string, 1)
	nc, _ := e.srv.Connect(t)
	e.startWith(nc, mesh.Options{
		Model:        routedModel{openai: executor.NewOpenAI(executor.OpenAIConfig{BaseURL: e.model.BaseURL(), APIKey: "test"}), started: started},
		DefaultModel: "unpriced-model", Prices: map[string]executor.Price{"priced-model": pricedModel},
		Scoring:  trust.Policy{ProbeAfter: 1},
		Registry: reg,
	})
	// The review queue, as the process serving the review page reports it.
	rc, err := review.New(review.Config{JS: e.srv.JS, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(review.NewQueueGauge(rc))

	run := func(id, typ string) {
		t.Helper()
		e.submit(events.Submit{ID: id, Type: typ, Subject: id + ".go"})
		e.waitEnd(id)
	}
	act := func(what func(context.Context, string, string, string) (review.Decision, error), id string) {
		t.Helper()
		if _, err := what(ctx, id, "a reviewer's note", "ann@test"); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	for i := range 3 {
		run(fmt.Sprintf("ok%d", i), "ok_fix")
	}
	run("sim0", "sim_fix")
	run("triage0", "triage_fix")
	run("bad0", "bad_fix")
	run("stale0", "stale_fix")
	e.submit(events.Submit{ID: "slow0", Type: "slow_fix", Subject: "slow0.go"})
	select {
	case <-started:
	case <-time.After(patience):
		t.Fatal("slow0's model call never started")
	}
	act(rc.Cancel, "slow0")
	run("flaky0", "flaky_fix")
	e.submit(events.Submit{ID: "doomed0", Type: "doomed_fix", Subject: "doomed0.go"})
	e.waitStage("doomed0", events.StageHeld) // held: trust
	run("doomed1", "doomed_fix")             // the probe: succeeds
	e.waitStatus("doomed0", events.StatusSucceeded)
	run("budget0", "budget_fix")
	run("budget1", "budget_fix") // gated: budget
	run("budget2", "budget_fix") // gated: budget
	act(rc.Reject, "budget1")
	act(rc.Requeue, "budget2")
	e.waitStatus("budget2", events.StatusSucceeded)
	e.waitIdle()

	// Human ends are counted by the recorder, once; the requeue ends nothing.
	finished := map[string]float64{
		"by=recorder,status=succeeded,type=ok_fix":          3,
		"by=recorder,status=succeeded,type=sim_fix":         1,
		"by=recorder,status=succeeded,type=triage_fix":      1,
		"by=recorder,status=blocked,type=bad_fix":           1,
		"by=verifier,status=cancelled,type=stale_fix":       1,
		"by=human,status=cancelled,type=slow_fix":           1,
		"by=recorder,status=succeeded,type=flaky_fix":       1,
		"by=recorder,status=succeeded,type=doomed_fix":      2,
		"by=recorder,status=succeeded,type=budget_fix":      2,
		"by=gate,status=needs_human_review,type=budget_fix": 2,
		"by=human,status=failed,type=budget_fix":            1,
	}
	// The recorder hears the review actions on a subscription, not
	// through its consumer (waitIdle): wait until it counted the last one.
	waitFor(t, "the human ends counted", func() bool {
		return metricstest.Family(t, reg, "dispatch_tasks_finished_total")["by=human,status=failed,type=budget_fix"] == 1
	})
	sim := e.state("sim0")
	idle := map[string]float64{}
	for _, name := range stageDurables {
		idle["service="+name] = 0
	}
	checks := []struct {
		name string
		want map[string]float64
	}{
		{"dispatch_tasks_finished_total", finished},
		{"dispatch_task_seconds", finished}, // its count
		{"dispatch_gate_decisions_total", map[string]float64{
			"cause=trusted,type=ok_fix":      3,
			"cause=unproven,type=sim_fix":    1,
			"cause=exempt,type=triage_fix":   1,
			"cause=unproven,type=bad_fix":    2,
			"cause=unproven,type=slow_fix":   1,
			"cause=unproven,type=flaky_fix":  1,
			"cause=trust,type=doomed_fix":    1, // held
			"cause=probe,type=doomed_fix":    1,
			"cause=trusted,type=doomed_fix":  1, // re-admitted: the probe's success re-opened the type
			"cause=unproven,type=budget_fix": 1,
			"cause=budget,type=budget_fix":   2,
			"cause=reviewed,type=budget_fix": 1,
		}},
		{"dispatch_executor_tokens_total", map[string]float64{
			"direction=in,model=priced-model,type=ok_fix":        300,
			"direction=out,model=priced-model,type=ok_fix":       150,
			"direction=in,model=simulated,type=sim_fix":          float64(sim.TokensIn),
			"direction=out,model=simulated,type=sim_fix":         float64(sim.TokensOut),
			"direction=in,model=unpriced-model,type=triage_fix":  100,
			"direction=out,model=unpriced-model,type=triage_fix": 50,
			"direction=in,model=unpriced-model,type=bad_fix":     200,
			"direction=out,model=unpriced-model,type=bad_fix":    100,
			"direction=in,model=unpriced-model,type=flaky_fix":   100, // the 503 reported no usage
			"direction=out,model=unpriced-model,type=flaky_fix":  50,
			"direction=in,model=unpriced-model,type=doomed_fix":  200,
			"direction=out,model=unpriced-model,type=doomed_fix": 100,
			"direction=in,model=unpriced-model,type=budget_fix":  200,
			"direction=out,model=unpriced-model,type=budget_fix": 100,
		}},
		{"dispatch_executor_cost_usd_total", map[string]float64{
			"model=priced-model,type=ok_fix":       3 * 2,
			"model=simulated,type=sim_fix":         0,
			"model=unpriced-model,type=triage_fix": 0,
			"model=unpriced-model,type=bad_fix":    0,
			"model=unpriced-model,type=flaky_fix":  0,
			"model=unpriced-model,type=doomed_fix": 0,
			"model=unpriced-model,type=budget_fix": 0,
		}},
		// Every delivery each stage's handler saw (its count).
		{"dispatch_handler_seconds", map[string]float64{
			"service=intake":   14, // one per task
			"service=verifier": 2,  // stale0's queued, budget2's requeue
			"service=gate":     15, // bad0 twice, budget2 twice, one pass for each other task
			"service=prompt":   13, // the admitted passes
			"service=executor": 14, // the same, and flaky0's second delivery
			"service=recorder": 12, // the attempts (it hears the review actions on a subscription)
		}},
		{"dispatch_redeliveries_total", map[string]float64{"service=executor": 1}},
		// Every stage idle (waitIdle): nothing queued, nothing in flight.
		{"dispatch_consumer_pending", idle},
		{"dispatch_consumer_ack_pending", idle},
		{"dispatch_review_queue_up", map[string]float64{"": 1}},
	}
	for _, c := range checks {
		got := metricstest.Family(t, reg, c.name)
		if c.name == "dispatch_handler_seconds" || c.name == "dispatch_redeliveries_total" {
			// doomed0's looks while held: as many as the probe took.
			if c.name == "dispatch_handler_seconds" && got["service="+services.ConsumerGateHeld] < 1 {
				t.Errorf("%s: no look at the held doomed0", c.name)
			}
			delete(got, "service="+services.ConsumerGateHeld)
			delete(got, "service="+services.ConsumerGateWake) // its probe's wake, if it was woken
		}
		if !maps.Equal(got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.name, sorted(got), sorted(c.want))
		}
	}
	if sim.TokensIn == 0 || sim.TokensOut == 0 {
		t.Errorf("sim0 spent %d tokens in and %d out: the simulated model reports tokens", sim.TokensIn, sim.TokensOut)
	}
	if got := metricstest.Family(t, reg, "dispatch_review_queue"); len(got) == 0 || got["reason=escalated"] != 1 || got["reason=gated"] != 0 {
		t.Errorf("dispatch_review_queue %v: want escalated 1 (bad0), gated 0 (every gated task was acted on)", sorted(got))
	}

	// Trust, read from the gate's view at the scrape: the view follows
	// the outcome stream, so wait until it holds the last outcome.
	var doomed []trust.Outcome
	for i := range 10 {
		doomed = append(doomed, trust.Outcome{Key: fmt.Sprintf("f%d", i), End: true})
	}
	doomedScore, _, _ := trust.Score(append(doomed, trust.Outcome{Key: "s1", Success: true}, trust.Outcome{Key: "s2", Success: true}), trust.Policy{})
	outcomes := map[string]float64{
		"type=ok_fix": 13, "type=sim_fix": 1, "type=triage_fix": 1, "type=bad_fix": 1, "type=flaky_fix": 1, // tasks: bad0's two attempts count once
		"type=doomed_fix": 12, "type=budget_fix": 2,
		"type=slow_fix": 0, // a canary place, no outcome
	}
	proctest.WaitFor(t, patience, "the trust view to hold every outcome", func() error {
		if got := metricstest.Family(t, reg, "dispatch_trust_outcomes"); !maps.Equal(got, outcomes) {
			return fmt.Errorf("dispatch_trust_outcomes: got %v, want %v", sorted(got), sorted(outcomes))
		}
		return nil
	})
	if got, want := metricstest.Family(t, reg, "dispatch_trust_score"), map[string]float64{"type=ok_fix": 1, "type=doomed_fix": doomedScore}; !maps.Equal(got, want) {
		t.Errorf("dispatch_trust_score: got %v, want %v (only the types with 10 outcomes are scored)", sorted(got), sorted(want))
	}

	// The Grafana dashboard in deploy/ is built on exactly these metrics.
	if unknown := unexportedDashboardMetrics(t, readDashboard(t), reg.names()); len(unknown) > 0 {
		t.Errorf("the dashboard's queries name %v, which no service exports", unknown)
	}
}

// waitStatus waits until the task has status.
func (e *env) waitStatus(id string, status events.Status) {
	e.t.Helper()
	waitFor(e.t, id+" "+string(status), func() bool {
		st, err := e.tasks.Get(context.Background(), id)
		return err == nil && st.Status == status
	})
}

// stageDurables are the six stages' consumers.
var stageDurables = []string{services.ConsumerIntake, services.ConsumerVerifier, services.ConsumerGate,
	services.ConsumerGateHeld, services.ConsumerGateWake, services.ConsumerPrompt, services.ConsumerExecutor, services.ConsumerRecorder}

// waitIdle waits until no stage consumer has anything pending or unacked.
func (e *env) waitIdle() {
	e.t.Helper()
	waitFor(e.t, "every stage idle", func() bool {
		for _, name := range stageDurables {
			c, err := e.srv.JS.Consumer(context.Background(), services.StreamOf(name), name)
			if err != nil {
				return false
			}
			ci, err := c.Info(context.Background())
			if err != nil || ci.NumPending > 0 || ci.NumAckPending > 0 {
				return false
			}
		}
		return true
	})
}

// waitFor waits until ok, up to patience (a deadlock guard, not a timing
// assertion).
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	proctest.WaitFor(t, patience, what, func() error {
		if ok() {
			return nil
		}
		return errors.New("not yet")
	})
}

func sorted(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  {%s} %v", k, m[k])
	}
	return b.String()
}
