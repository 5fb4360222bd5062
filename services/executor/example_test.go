package executor_test

import (
	"fmt"

	"dispatchmesh/services/executor"
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
