package prompt

import (
	"slices"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

// DefaultPromptBudget is how many tokens (≈ characters / 4) of the past a
// prompt carries when the type's policy sets no prompt_budget: the reviewer's
// note, the last error, the dead ends and the previous attempts together.
const DefaultPromptBudget = 300

// charsPerToken is the rough size of a token in English text and code.
const charsPerToken = 4

// Per-item caps, in characters: one dead end or previous attempt is a line,
// not a transcript.
const (
	maxLineChars = 200
	maxNoteShare = 4 // a note takes at most a quarter of the budget
	maxLastShare = 2 // the last error at most half of what is left
)

// past is what a prompt carries of the past, fitted to a budget.
type past struct {
	note, lastError string
	// deadEnds are the dead ends shown, clipped; enforced are the same
	// dead ends whole, as the run carries them to the PIVOT judgement.
	deadEnds, enforced []events.DeadEnd
	previous           []history.Entry
}

// fitPast chooses what of the past goes into the prompt of run, most
// informative first, until budget tokens are used:
//
//  1. the reviewer's note (a human's word), at most a quarter of the budget;
//  2. the last error, at most half of what is left — what the next attempt
//     must fix, kept from its start and its end when it is long;
//  3. on PIVOT and RESEARCH, the dead ends, newest first, one line each,
//     the same approach once, at most the ladder.MaxDeadEnds a task keeps —
//     these, and only these, are the dead ends a PIVOT answer is judged
//     against (past.enforced);
//  4. the previous attempts on the subject, newest first, one line each:
//     failures whose approach is not already a listed dead end (without
//     their error when it is the last error), and the newest success, which
//     says what worked. A history of nothing but successes teaches nothing and is left
//     out, so a task whose subject never failed pays for no history.
//
// Previous attempts and dead ends keep their chronological order in the
// prompt. Texts are cut at rune boundaries; nothing is escaped here.
func fitPast(run events.Run, previous []history.Entry, budget int) past {
	if budget <= 0 {
		budget = DefaultPromptBudget
	}
	left := budget * charsPerToken
	var p past
	take := func(s string, limit int) string {
		s = clip(strings.TrimSpace(s), min(limit, left))
		left -= len(s)
		return s
	}
	p.note = take(run.Note, left/maxNoteShare)
	p.lastError = take(run.Context, left/maxLastShare)

	shown := map[string]bool{} // normalised approaches already in the prompt
	if usesDeadEnds(run.Rung) {
		// At most what a task keeps (ladder.CapDeadEnds), whatever the budget.
		for _, d := range slices.Backward(ladder.CapDeadEnds(run.DeadEnds)) {
			key := ladder.Normalize(d.Approach)
			if shown[key] {
				continue
			}
			whole := d
			d.Approach = clip(d.Approach, maxLineChars/2)
			d.Reason = clip(oneLine(d.Reason), maxLineChars-len(d.Approach))
			cost := len(FormatDeadEnds([]events.DeadEnd{d})) // wrapper included: an upper bound
			if cost > left {
				break
			}
			left -= cost
			shown[key] = true
			p.deadEnds, p.enforced = append(p.deadEnds, d), append(p.enforced, whole)
		}
		slices.Reverse(p.deadEnds)
		slices.Reverse(p.enforced)
	}

	if !slices.ContainsFunc(previous, func(e history.Entry) bool { return e.Outcome != events.OutcomeSuccess }) {
		return p
	}
	lastErr := oneLine(run.Context)
	success := false
	for _, e := range slices.Backward(previous) {
		key := ladder.Normalize(e.Approach)
		if e.Outcome == events.OutcomeSuccess {
			if success {
				continue
			}
			success = true
		} else if key != "" && shown[key] {
			continue // listed as a dead end
		}
		if lastErr != "" && oneLine(e.Error) == lastErr {
			e.Error = "" // the prompt carries it as the last error
		}
		e = clipEntry(e)
		cost := len(history.Format([]history.Entry{e})) // wrapper included: an upper bound
		if cost > left {
			break
		}
		left -= cost
		if key != "" {
			shown[key] = true
		}
		p.previous = append(p.previous, e)
	}
	slices.Reverse(p.previous)
	return p
}

func usesDeadEnds(rung events.Rung) bool {
	return rung != "" && !strings.EqualFold(string(rung), string(events.RungRefine))
}

// clipEntry shortens an entry to one line of at most maxLineChars.
func clipEntry(e history.Entry) history.Entry {
	e.TaskID = "" // which task tried it does not help the next attempt
	e.Approach = clip(oneLine(e.Approach), maxLineChars/3)
	e.Error = clip(oneLine(e.Error), maxLineChars-len(e.Approach))
	e.Summary = clip(oneLine(e.Summary), maxLineChars-len(e.Approach)-len(e.Error))
	if e.Error != "" && strings.Contains(e.Error, e.Summary) {
		e.Summary = "" // a failure's summary is usually its error
	}
	return e
}

// clip shortens s to at most n bytes: its start and its end around an
// ellipsis (an error's cause is often at one end), cut at rune boundaries.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = " … "
	if n <= len(mark)+8 {
		return textcut.Start(s, n)
	}
	head := (n - len(mark)) * 2 / 3
	tail := n - len(mark) - head
	return textcut.Start(s, head) + mark + textcut.End(s, tail)
}

// oneLine collapses runs of white space to single spaces.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
