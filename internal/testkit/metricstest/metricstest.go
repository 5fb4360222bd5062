// Package metricstest reads what a Prometheus registry gathered, for
// tests that assert exact metric values. Only tests import it.
package metricstest

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Family is every series of a metric family: "label=value,…" (labels in
// name order) → the value of a counter or gauge, the count of a histogram.
// A family with no series (or none gathered) is an empty map.
func Family(t testing.TB, g prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := strings.Join(labels, ",")
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
