package history_test

import (
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/history"
)

func ExampleFormat() {
	entries := []history.Entry{
		{
			TaskID: "fix-42", Outcome: "failure", Rung: "REFINE",
			At:       time.Date(2026, 5, 18, 14, 22, 0, 0, time.UTC),
			Approach: "Tried adding null check in handleResponse()", Error: "wrong location",
		},
		{
			TaskID: "fix-42", Outcome: "failure", Rung: "REFINE",
			At:       time.Date(2026, 5, 18, 14, 31, 0, 0, time.UTC),
			Approach: "Guarded the <nil> response", Summary: "still panics",
		},
	}
	fmt.Print(history.Format(entries))
	// Output:
	// <previous_attempts>
	//   <attempt n="1" outcome="failure" at="2026-05-18T14:22:00Z" rung="REFINE" task="fix-42">
	//     Tried adding null check in handleResponse() -- error: wrong location
	//   </attempt>
	//   <attempt n="2" outcome="failure" at="2026-05-18T14:31:00Z" rung="REFINE" task="fix-42">
	//     Guarded the &lt;nil&gt; response -- still panics
	//   </attempt>
	// </previous_attempts>
}
