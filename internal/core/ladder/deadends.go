package ladder

import (
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

// Caps on the dead-ends log a task carries (TaskState.DeadEnds, a run's
// Run.DeadEnds). A prompt shows a dead end as one line (prompt.maxLineChars:
// 200 characters), newest first, as many as its prompt_budget holds; 32
// cover more than four rounds of the default seven attempts, beside an
// earlier task's five. The approach is kept whole as the executor caps an
// answer's (events.MaxApproach), so a PIVOT answer repeating it is still
// recognised; the reason as the subject's history keeps an error (2 KiB).
// The log holds at most 32 × 4 KiB of text.
const (
	MaxDeadEnds      = 32
	MaxDeadEndReason = 2 << 10
)

// CapDeadEnds bounds a dead-ends log (oldest first): past MaxDeadEnds the
// oldest are dropped first — except the newest dead end of the task's own
// RESEARCH pass, from which the ladder knows the round's RESEARCH pass is
// made (ResearchUsedSince) — and each kept approach and reason is cut to
// events.MaxApproach and MaxDeadEndReason bytes, the cut marked
// (textcut.Mark). ends is not modified; an empty log is returned as it is.
func CapDeadEnds(ends []events.DeadEnd) []events.DeadEnd {
	if len(ends) == 0 {
		return ends
	}
	research := -1
	for i, d := range ends {
		if d.Rung == events.RungResearch && d.Attempt > 0 {
			research = i
		}
	}
	drop := len(ends) - MaxDeadEnds
	out := make([]events.DeadEnd, 0, min(len(ends), MaxDeadEnds))
	for i, d := range ends {
		if drop > 0 && i != research {
			drop--
			continue
		}
		d.Approach = textcut.Cut(d.Approach, events.MaxApproach)
		d.Reason = textcut.Cut(d.Reason, MaxDeadEndReason)
		out = append(out, d)
	}
	return out
}
