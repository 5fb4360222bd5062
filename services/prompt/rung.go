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
	RungPivot: "The previous approaches are dead ends: do not repeat them. " +
		"Use a fundamentally different approach and name it in the approach field.",
	RungResearch: "Research the problem first (read the relevant code, documentation " +
		"and logs with the tools you have) before acting, then act on what you found.",
}

// RungInstructions returns the instruction for an escalation rung: "" when
// rung is empty or not one that changes the prompt.
func RungInstructions(rung string) string {
	return rungInstructions[strings.ToUpper(strings.TrimSpace(rung))]
}
