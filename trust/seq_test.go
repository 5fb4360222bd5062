package trust_test

import (
	"strconv"
	"time"

	"github.com/dispatchmesh/dispatchmesh/trust"
)

// seq builds outcomes from a pattern of S (success) and F (failure), oldest
// first: each one a task of one attempt, which ended.
func seq(pattern string) []trust.Outcome {
	base := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	out := make([]trust.Outcome, len(pattern))
	for i, c := range pattern {
		out[i] = trust.Outcome{Key: "t" + strconv.Itoa(i) + ":1", Success: c == 'S', End: true, At: base.Add(time.Duration(i) * time.Minute)}
	}
	return out
}
