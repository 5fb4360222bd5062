package executor

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/metricstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

func TestToolLabel(t *testing.T) {
	offered := map[string]policy.Tool{"create_user": {Name: "create_user"}, "search_docs": {Name: "search_docs"}}
	for _, c := range []struct{ name, want string }{
		{"create_user", "create_user"},
		{"search_docs", "search_docs"},
		{"drop_all_tables", toolUnknown},
		{"", toolUnknown},
	} {
		if got := toolLabel(offered, c.name); got != c.want {
			t.Errorf("toolLabel(%q) = %q, want %q", c.name, got, c.want)
		}
	}
	if got := toolLabel(nil, "create_user"); got != toolUnknown {
		t.Errorf("no tools offered: toolLabel = %q, want %q", got, toolUnknown)
	}
}

// The model names a provider answers with, or an agent command reports,
// and the types clients submit make a bounded number of series: the
// priced models and the default, maxModelLabels others, and other; the
// types the policy names, the set's limit, and other.
func TestUsageLabelsAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := Config{Prices: map[string]Price{"gpt-4o": {}}, DefaultModel: "gpt-4o-mini"}
	const maxTypes = 3
	m := newMetrics(reg, services.NewLabelSet(maxTypes, func(t string) bool { return t == "css_fix" }), cfg.modelLabels(), cfg.routeLabels())
	for i := range 1000 {
		m.usage(fmt.Sprintf("model-%d", i), fmt.Sprintf("type_%d", i), 1, 1, 0)
		m.promptTokens(fmt.Sprintf("type_%d", i), events.RungRefine, 1)
	}
	m.usage("gpt-4o", "css_fix", 1, 1, 0)
	m.usage("gpt-4o-mini", "css_fix", 1, 1, 0)
	models, types := map[string]bool{}, map[string]bool{}
	for key := range metricstest.Family(t, reg, "dispatch_executor_cost_usd_total") {
		model, typ, _ := strings.Cut(key, ",") // labels in name order: model=…,type=…
		models[strings.TrimPrefix(model, "model=")], types[strings.TrimPrefix(typ, "type=")] = true, true
	}
	if len(models) != 2+maxModelLabels+1 || !models["gpt-4o"] || !models["gpt-4o-mini"] || !models[services.LabelOther] {
		t.Errorf("%d models %v, want gpt-4o, gpt-4o-mini, %d others and other", len(models), models, maxModelLabels)
	}
	if len(types) != 1+maxTypes+1 || !types["css_fix"] || !types[services.LabelOther] {
		t.Errorf("%d types %v, want css_fix, %d others and other", len(types), types, maxTypes)
	}
	if n := len(metricstest.Family(t, reg, "dispatch_prompt_tokens")); n != maxTypes+1 {
		t.Errorf("dispatch_prompt_tokens has %d series, want %d", n, maxTypes+1)
	}
}
