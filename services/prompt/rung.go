package prompt

import (
	"strings"

	"dispatchmesh/events"
)

// Rungs of the escalation ladder that change what the prompt asks for (SPEC §8).
const (
	RungRefine   = "REFINE"
	RungPivot    = "PIVOT"
	RungResearch = "RESEARCH"
)

// rungInstructions maps a rung to the instruction the prompt carries.
var rungInstructions = map[string]string{
	RungRefine: "Keep the previous approach and fix what the last error names.",
	RungPivot: "Use an approach different from every dead end and name it in the approach field; " +
		"repeating a dead end is rejected.",
	RungResearch: "Research first with the tools offered for this attempt, verify what you find, " +
		"then act with an approach that is not a dead end.",
}

// RungInstructions returns the instruction for an escalation rung: "" when
// rung is empty or not one that changes the prompt.
func RungInstructions(rung events.Rung) string {
	return rungInstructions[strings.ToUpper(strings.TrimSpace(string(rung)))]
}
