package prompt_test

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/services/prompt"
)

// The default template for the second attempt at a task, with the first
// attempt's outcome injected as <previous_attempts> and its error as
// <last_error>. Text from the model and the tool is escaped.
func Example() {
	tmpl, err := prompt.Parse(prompt.DefaultTemplate)
	if err != nil {
		panic(err)
	}
	base := events.Base{
		Task: events.Task{
			ID: "t42", Type: "css_fix", Subject: "src/app.css",
			Payload: json.RawMessage(`{"selector":".btn","issue":"text overflows"}`),
		},
		Run: events.Run{Pass: 2, Attempt: 2, Rung: prompt.RungRefine, Step: "execute",
			Context: "lint: unknown property <overflow-wrap>"},
	}
	previous := []history.Entry{{
		Key: "css_fix/src/app.css", TaskID: "t42", Attempt: 1, Step: "execute",
		Outcome: "failure", Approach: "set overflow: hidden",
		Summary: "clipped the text instead of wrapping it", Error: "visual diff failed",
		At: time.Date(2026, 5, 18, 14, 22, 0, 0, time.UTC),
	}}
	user, err := prompt.Render(tmpl, prompt.NewData(base, previous))
	if err != nil {
		panic(err)
	}
	fmt.Print(user)
	// Output:
	// <task type="css_fix" subject="src/app.css">
	// <payload>{"selector":".btn","issue":"text overflows"}</payload>
	// </task>
	// <previous_attempts>
	//   <attempt n="1" outcome="failure" at="2026-05-18T14:22:00Z">
	//     set overflow: hidden -- clipped the text instead of wrapping it -- error: visual diff failed
	//   </attempt>
	// </previous_attempts>
	// <last_error>lint: unknown property &lt;overflow-wrap&gt;</last_error>
	// <instructions rung="REFINE">Keep the previous approach and fix what the last error names.</instructions>
}
