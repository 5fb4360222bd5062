package prompt

import (
	"strings"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
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

// researchWithoutTools is RESEARCH's instruction for a type whose policy
// offers no tools: the attempt cannot look anything up, so it is asked to
// work out what it does not know before it acts.
const researchWithoutTools = "No tools are offered for this attempt: before you act, work out from the task, " +
	"the previous attempts and the dead ends what the failures show you did not know, say it in the summary, " +
	"then act with an approach that is not a dead end."

// RungInstructions returns the instruction for an escalation rung: "" when
// rung is empty or not one that changes the prompt.
func RungInstructions(rung events.Rung) string {
	return rungInstructions[strings.ToUpper(strings.TrimSpace(string(rung)))]
}

// offersTools reports whether an attempt of pol's type on rung is offered
// tools (the executor offers Tools, and ResearchTools on RESEARCH).
func offersTools(pol policy.Type, rung events.Rung) bool {
	return len(pol.Tools) > 0 || (rung == events.RungResearch && len(pol.ResearchTools) > 0)
}
