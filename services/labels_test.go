package services_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/metricstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// A LabelSet gives the named values and the first max others a label of
// their own, and every later value LabelOther, for as long as it lives.
func TestLabelSet(t *testing.T) {
	named := func(v string) bool { return v == "css_fix" || v == "bug_fix" }
	for _, c := range []struct {
		name   string
		set    *services.LabelSet
		values []string
		want   []string
	}{
		{"room for two", services.NewLabelSet(2, nil),
			[]string{"a", "b", "c", "a", "d", "b"},
			[]string{"a", "b", "other", "a", "other", "b"}},
		{"named values take no room", services.NewLabelSet(1, named),
			[]string{"css_fix", "a", "bug_fix", "b", "css_fix"},
			[]string{"css_fix", "a", "bug_fix", "other", "css_fix"}},
		{"no room: only the named", services.NewLabelSet(0, named),
			[]string{"a", "css_fix", "b"},
			[]string{"other", "css_fix", "other"}},
		{"negative max is no room", services.NewLabelSet(-3, nil),
			[]string{"a"},
			[]string{"other"}},
		{"a value named later gets its own label", services.NewLabelSet(0, func(v string) bool { return v == "late" }),
			[]string{"late"},
			[]string{"late"}},
		{"nil set: everything other", nil,
			[]string{"css_fix", "a"},
			[]string{"other", "other"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, v := range c.values {
				got = append(got, c.set.Label(v))
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("labels %q, want %q", got, c.want)
			}
		})
	}
}

// 10,000 distinct types, submitted concurrently, make at most N+1 series
// (N of their own, one other) besides the types the policy names, and
// every observation is counted.
func TestLabelSetBoundsSeries(t *testing.T) {
	const n, types = 100, 10_000
	reg := prometheus.NewRegistry()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tasks_total", Help: "test"}, []string{"type"})
	reg.MustRegister(vec)
	set := services.NewLabelSet(n, func(v string) bool { return v == "css_fix" })
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < types; i += 8 {
				vec.WithLabelValues(set.Label(fmt.Sprintf("made_up_%d", i))).Inc()
				vec.WithLabelValues(set.Label("css_fix")).Inc()
			}
		})
	}
	wg.Wait()
	series := metricstest.Family(t, reg, "tasks_total")
	if len(series) > n+2 {
		t.Fatalf("%d series, want at most %d (N + other + css_fix)", len(series), n+2)
	}
	var total float64
	for _, v := range series {
		total += v
	}
	if series["type=css_fix"] != types || series["type=other"] != types-n || total != 2*types {
		t.Errorf("css_fix %v, other %v, total %v; want %d, %d, %d", series["type=css_fix"], series["type=other"], total, types, types-n, 2*types)
	}
}
