package mesh_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const dashboardFile = "../../deploy/grafana/dispatchmesh.json"

func readDashboard(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

var metricName = regexp.MustCompile(`\bdispatch_[a-z0-9_]+`)

// dashboardMetrics is every metric the dashboard's queries name. It walks
// the whole document and reads every "expr" and "query" string, at any
// depth: the targets of every panel, the panels of collapsed rows
// (panels[].panels) included, the template variables' queries
// (templating.list[].query, a string or an object holding one), the
// annotations'.
func dashboardMetrics(t *testing.T, data []byte) []string {
	t.Helper()
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var names []string
	queries := 0
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "query") {
					queries++
					for _, m := range metricName.FindAllString(s, -1) {
						if !slices.Contains(names, m) {
							names = append(names, m)
						}
					}
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	if queries == 0 {
		t.Fatal("the dashboard has no queries")
	}
	slices.Sort(names)
	return names
}

// unexportedDashboardMetrics is every metric the dashboard names that is
// not in exported (a histogram's _bucket, _sum and _count series count as
// its name).
func unexportedDashboardMetrics(t *testing.T, data []byte, exported []string) []string {
	t.Helper()
	var unknown []string
	for _, m := range dashboardMetrics(t, data) {
		base := m
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(m, suffix); ok && slices.Contains(exported, b) {
				base = b
			}
		}
		if !slices.Contains(exported, base) {
			unknown = append(unknown, m)
		}
	}
	return unknown
}

// The dashboard check reads every query: a made-up metric in a collapsed
// row's nested panel, in a template variable's query (a string, or an
// object as newer Grafana writes it) or in an annotation is reported.
func TestDashboardCheckReadsEveryQuery(t *testing.T) {
	data := readDashboard(t)
	exported := dashboardMetrics(t, data) // the names the real dashboard uses: only made-up ones are unknown
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	doc["panels"] = append(doc["panels"].([]any), map[string]any{
		"type": "row", "title": "Collapsed", "collapsed": true,
		"panels": []any{map[string]any{
			"type": "timeseries", "title": "hidden",
			"targets": []any{map[string]any{"expr": `sum(rate(dispatch_made_up_in_a_row_total[5m]))`, "refId": "A"}},
		}},
	})
	tmpl := doc["templating"].(map[string]any)
	tmpl["list"] = append(tmpl["list"].([]any),
		map[string]any{"name": "v1", "type": "query", "query": "label_values(dispatch_made_up_in_a_variable, type)"},
		map[string]any{"name": "v2", "type": "query", "query": map[string]any{"query": "label_values(dispatch_made_up_in_a_query_object, service)", "refId": "V"}},
	)
	doc["annotations"] = map[string]any{"list": []any{map[string]any{"name": "a", "expr": "changes(dispatch_made_up_in_an_annotation[5m]) > 0"}}}
	broken, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	got := unexportedDashboardMetrics(t, broken, exported)
	want := []string{"dispatch_made_up_in_a_query_object", "dispatch_made_up_in_a_row_total", "dispatch_made_up_in_a_variable", "dispatch_made_up_in_an_annotation"}
	if !slices.Equal(got, want) {
		t.Fatalf("reported %v, want exactly the made-up names %v", got, want)
	}
	// A histogram's series need the histogram; a name that only ends like
	// one does not pass.
	if got := unexportedDashboardMetrics(t, []byte(`{"panels":[{"targets":[{"expr":"dispatch_task_seconds_bucket + dispatch_nothing_count"}]}]}`), []string{"dispatch_task_seconds"}); !slices.Equal(got, []string{"dispatch_nothing_count"}) {
		t.Fatalf("reported %v, want [dispatch_nothing_count]", got)
	}
}
