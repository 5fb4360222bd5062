package prompt

import "strings"

// Rungs of the escalation ladder that change what the prompt asks for (SPEC §8).
const (
	RungRefine   = "REFINE"
	RungPivot    = "PIVOT"
	RungResearch = "RESEARCH"
)

// rungInstructions maps a rung to the instruction the prompt carries.
var rungInstructions = map[string]string{
	RungRefine: "Keep the same approach as the previous attempt and adjust it, " +
		"using the last error to fix what went wrong.",
	RungPivot: "The approaches listed as dead ends failed: do not repeat any of them. " +
		"Use a fundamentally different approach and name it in the approach field; " +
		"an answer whose approach repeats a dead end is rejected.",
	RungResearch: "Research the problem first, your knowledge may be stale (read the relevant code, " +
		"documentation and logs with the research tools offered for this attempt) and verify what you find " +
		"before acting, then act on it with an approach that is not a dead end.",
}

// RungInstructions returns the instruction for an escalation rung: "" when
// rung is empty or not one that changes the prompt.
func RungInstructions(rung string) string {
	return rungInstructions[strings.ToUpper(strings.TrimSpace(rung))]
}
