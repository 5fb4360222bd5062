package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/internal/bench/spendbench"
)

// `dispatch bench spend` flags: unset ones take the workload's defaults,
// today's invocation is unchanged, and contradictions are refused.
func TestParseBenchSpend(t *testing.T) {
	both := []string{spendbench.ModeOnce, spendbench.ModeSteady}
	for _, c := range []struct {
		args    []string
		shape   string
		tasks   int
		context int
		modes   []string
	}{
		{nil, spendbench.ShapeDefault, 0, 1000, both},
		{[]string{"-tasks", "300", "-mode", "both", "-context", "1000"}, spendbench.ShapeDefault, 300, 1000, both},
		{[]string{"-context", "0", "-mode", "once"}, spendbench.ShapeDefault, 0, -1, []string{spendbench.ModeOnce}},
		{[]string{"-workload", "regression"}, spendbench.ShapeRegression, 0, 1000, []string{spendbench.ModeSteady}},
		{[]string{"-workload", "steady", "-prompt", "long"}, spendbench.ShapeSteady, 0, 1000, []string{spendbench.ModeSteady}},
		{[]string{"-workload", "batch", "-prompt", "short"}, spendbench.ShapeBatch, 0, -1, both},
		{[]string{"-workload", "longtail", "-mode", "steady"}, spendbench.ShapeLongTail, 0, 1000, []string{spendbench.ModeSteady}},
	} {
		r, err := parseBenchSpend(c.args)
		if err != nil {
			t.Errorf("%v: %v", c.args, err)
			continue
		}
		w := r.cfg.Workload
		if w.Shape != c.shape || w.Tasks != c.tasks || w.ContextTokens != c.context || !slices.Equal(r.modes, c.modes) {
			t.Errorf("%v: shape %q, tasks %d, context %d, modes %v; want %q, %d, %d, %v",
				c.args, w.Shape, w.Tasks, w.ContextTokens, r.modes, c.shape, c.tasks, c.context, c.modes)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-workload", "nonesuch"}, "-workload"},
		{[]string{"-workload", "longtail", "-tasks", "10"}, "fixed size"},
		{[]string{"-prompt", "medium"}, "-prompt"},
		{[]string{"-prompt", "short", "-context", "50"}, "give one"},
		{[]string{"-mode", "sometimes"}, "-mode"},
		{[]string{"-tasks", "-1"}, "positive"},
		{[]string{"stray"}, "unexpected argument"},
	} {
		if _, err := parseBenchSpend(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %q", c.args, err, c.want)
		}
	}
}
