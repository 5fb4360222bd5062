package mesh_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dispatchmesh/events"
	"dispatchmesh/internal/openaitest"
	"dispatchmesh/internal/policy"
	"dispatchmesh/internal/review"
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

// A scripted run: three tasks that succeed, two that fail until their
// attempt limit, one whose problem is already gone. Every counter holds
// exactly what happened.
func TestMetricsOfAScriptedRun(t *testing.T) {
	e := newEnv(t, func(_ int, req openaitest.Request) openaitest.Reply {
		if strings.Contains(req.Messages[1].Content, `type="bad_fix"`) {
			return openaitest.Reply{Content: openaitest.Failure("an idea", "no")}
		}
		return openaitest.Reply{Content: openaitest.Success("the fix")}
	}, &policy.File{Types: map[string]policy.Type{
		"bad_fix":   {MaxRetries: 2},
		"stale_fix": {Verifier: &policy.Verifier{Kind: policy.VerifierCommand, Command: []string{"sh", "-c", "exit 1"}}},
	}})
	reg := &recordingRegistry{Registry: prometheus.NewPedanticRegistry()}
	e.registry = reg
	e.start()
	// The review queue, as the process serving the review page reports it.
	rc, err := review.New(review.Config{JS: e.srv.JS})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(review.NewQueueGauge(rc))
	var ids []string
	for i := range 3 {
		ids = append(ids, e.submit(events.Submit{ID: fmt.Sprintf("ok%d", i), Type: "ok_fix", Subject: fmt.Sprintf("ok%d.go", i)}))
	}
	for i := range 2 {
		ids = append(ids, e.submit(events.Submit{ID: fmt.Sprintf("bad%d", i), Type: "bad_fix", Subject: fmt.Sprintf("bad%d.go", i)}))
	}
	ids = append(ids, e.submit(events.Submit{ID: "stale", Type: "stale_fix", Subject: "stale.go"}))
	for _, id := range ids {
		e.waitEnd(id)
	}

	for _, c := range []struct {
		metric prometheus.Collector
		name   string
		labels []string
		want   float64
	}{
		{nil, "dispatch_tasks_finished_total", []string{"ok_fix", string(events.StatusSucceeded)}, 3},
		{nil, "dispatch_tasks_finished_total", []string{"bad_fix", string(events.StatusBlocked)}, 2},
		{nil, "dispatch_tasks_finished_total", []string{"stale_fix", string(events.StatusCancelled)}, 1},
		{nil, "dispatch_gate_decisions_total", []string{"ok_fix", string(events.CauseUnproven)}, 3},
		{nil, "dispatch_gate_decisions_total", []string{"bad_fix", string(events.CauseUnproven)}, 4},
		{nil, "dispatch_attempts_total", []string{"ok_fix", string(events.RungRefine), events.OutcomeSuccess}, 3},
		{nil, "dispatch_attempts_total", []string{"bad_fix", string(events.RungRefine), events.OutcomeFailure}, 4},
		{nil, "dispatch_retries_total", []string{"bad_fix", string(events.RungRefine), events.OutcomeFailure}, 2},
		{nil, "dispatch_wasted_tokens_total", []string{"bad_fix"}, 4 * 150},
		{nil, "dispatch_resolved_tokens_total", []string{"ok_fix"}, 3 * 150},
		{nil, "dispatch_review_queue", []string{events.ReviewEscalated}, 2},
		{nil, "dispatch_review_queue", []string{events.ReviewGated}, 0},
		{nil, "dispatch_review_queue_up", nil, 1},
	} {
		if got := sample(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(reg, "dispatch_task_seconds"); n != 3 {
		t.Errorf("dispatch_task_seconds has %d series, want 3 (one per type and status)", n)
	}
	if n := testutil.CollectAndCount(reg, "dispatch_consumer_pending"); n < 6 {
		t.Errorf("dispatch_consumer_pending has %d series, want one per stage", n)
	}
	if n := testutil.CollectAndCount(reg, "dispatch_trust_score"); n != 2 {
		t.Errorf("dispatch_trust_score has %d series, want one per type the gate saw", n)
	}

	if n := testutil.CollectAndCount(reg, "dispatch_review_queue"); n != len(review.Reasons) {
		t.Errorf("dispatch_review_queue has %d series, want one per reason %v", n, review.Reasons)
	}

	// The Grafana dashboard in deploy/ is built on exactly these metrics.
	data, err := os.ReadFile("../../deploy/grafana/dispatchmesh.json")
	if err != nil {
		t.Fatal(err)
	}
	exported := reg.names()
	for _, m := range dashboardMetrics(t, data) {
		if !slices.Contains(exported, m) && !slices.Contains(exported, strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")) {
			t.Errorf("the dashboard's expressions name %s, which no service exports", m)
		}
	}
}

// sample is the value of one labelled series of a counter or gauge family.
func sample(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var vals []string
			for _, l := range m.GetLabel() {
				vals = append(vals, l.GetValue())
			}
			slices.Sort(vals)
			want := slices.Clone(labels)
			slices.Sort(want)
			if slices.Equal(vals, want) {
				if c := m.GetCounter(); c != nil {
					return c.GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

var metricName = regexp.MustCompile(`\bdispatch_[a-z0-9_]+`)

// dashboardMetrics is every metric a panel's expression names.
func dashboardMetrics(t *testing.T, data []byte) []string {
	t.Helper()
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var names []string
	exprs := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs++
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				if !slices.Contains(names, m) {
					names = append(names, m)
				}
			}
		}
	}
	if exprs == 0 {
		t.Fatal("the dashboard has no expressions")
	}
	return names
}
