package executor_test

import (
	"fmt"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

func ExampleParseResult() {
	answer := "Here you go:\n```json\n" +
		`{"status":"failure","approach":"null check in handleResponse","summary":"wrong location"}` +
		"\n```"
	r, err := executor.ParseResult(answer)
	fmt.Println(r.Status, "|", r.Approach, "|", r.Summary, "|", err)

	_, err = executor.ParseResult("I fixed it, trust me.")
	fmt.Println(err)
	// Output:
	// failure | null check in handleResponse | wrong location | <nil>
	// invalid model output: no JSON object in the answer; the answer was "I fixed it, trust me."
}

func ExamplePromptText() {
	fmt.Print(executor.PromptText([]events.Message{
		{Role: "user", Content: "Fix the button colour in app.css."},
		{Role: "system", Content: "Answer with JSON."},
	}))
	// Output:
	// [system]
	// Answer with JSON.
	//
	// [user]
	// Fix the button colour in app.css.
}
