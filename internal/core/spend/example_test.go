package spend_test

import (
	"fmt"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/spend"
)

func ExampleFold() {
	r := spend.Fold(
		// Resolved on the third attempt, after failing twice the same way.
		task("css_fix", events.StatusSucceeded,
			fail(refine, events.ErrorClassTask, "still red", 1000, 100, 0.01),
			fail(refine, events.ErrorClassTask, "still red", 1000, 100, 0.01),
			ok(pivot, 1500, 200, 0.02)),
		// Handed off after a deterministic failure and a refused repeat.
		task("css_fix", events.StatusBlocked,
			fail(refine, events.ErrorClassDeterministic, "400 unknown parameter", 800, 0, 0.008),
			refused(refine)),
	)
	f := r.Types[0]
	fmt.Printf("%s: %d tasks, %d resolved, %d unresolved\n", f.Type, f.Tasks, f.Resolved, f.Unresolved)
	fmt.Printf("wasted %d tokens, $%.3f\n", f.WastedTokens, f.WastedCost)
	fmt.Printf("retries %d, succeeded %.0f%%; same error %d\n", f.Retries, 100**f.RetrySuccessRate, f.SameErrorRetries)
	fmt.Printf("loop rate %.1f attempts, $%.3f per resolved task\n", *f.LoopRate, *f.CostPerResolved)
	fmt.Printf("repeat-call rate %.0f%% (%d of %d requests refused)\n", 100**f.RepeatCallRate, f.Refused, f.Attempts)
	fmt.Printf("REFINE prompt tokens per attempt %.0f\n", *f.Rungs[string(events.RungRefine)].PromptTokensPerAttempt)
	// Output:
	// css_fix: 2 tasks, 1 resolved, 1 unresolved
	// wasted 800 tokens, $0.008
	// retries 3, succeeded 33%; same error 1
	// loop rate 3.0 attempts, $0.040 per resolved task
	// repeat-call rate 20% (1 of 5 requests refused)
	// REFINE prompt tokens per attempt 933
}
