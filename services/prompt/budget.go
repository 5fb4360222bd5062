package prompt

import (
	"slices"
	"strings"
	"unicode"

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
//     the same approach once (without its reason when it is the last
//     error), at most the ladder.MaxDeadEnds a task keeps —
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
	said := map[string]bool{}  // the gist of every error and summary already in the prompt
	say := func(text string) {
		if g := gist(text); g != "" {
			said[g] = true
		}
	}
	// fresh: text is not empty and not said already, up to its numbers
	// (the same error again at another try, line or count).
	fresh := func(text string) bool { g := gist(text); return g != "" && !said[g] }
	lastErr := oneLine(run.Context)
	say(lastErr)
	if usesDeadEnds(run.Rung) {
		// At most what a task keeps (ladder.CapDeadEnds), whatever the budget.
		for _, d := range slices.Backward(ladder.CapDeadEnds(run.DeadEnds)) {
			key := ladder.Normalize(d.Approach)
			if shown[key] {
				continue
			}
			whole := d
			d.Approach = clip(d.Approach, maxLineChars/2)
			d.Reason = oneLine(d.Reason)
			if !fresh(d.Reason) {
				d.Reason = "" // the prompt carries it already: the last error, or a newer dead end's
			}
			reason := d.Reason
			d.Reason = clip(d.Reason, maxLineChars-len(d.Approach))
			cost := len(FormatDeadEnds([]events.DeadEnd{d})) // wrapper included: an upper bound
			if cost > left {
				break
			}
			left -= cost
			shown[key] = true
			say(reason)
			p.deadEnds, p.enforced = append(p.deadEnds, d), append(p.enforced, whole)
		}
		slices.Reverse(p.deadEnds)
		slices.Reverse(p.enforced)
	}

	if !slices.ContainsFunc(previous, func(e history.Entry) bool { return e.Outcome != events.OutcomeSuccess }) {
		return p
	}
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
		if !fresh(e.Summary) {
			e.Summary = "" // a failure's summary is often its error
		}
		if !fresh(e.Error) {
			e.Error = "" // the prompt carries it already: the last error, or a newer attempt's
		}
		errText, summary := e.Error, e.Summary // whole: clipEntry clips them
		e = clipEntry(e)
		cost := len(history.Format([]history.Entry{e})) // wrapper included: an upper bound
		if cost > left {
			break
		}
		left -= cost
		if key != "" {
			shown[key] = true
		}
		say(errText)
		say(summary)
		p.previous = append(p.previous, e)
	}
	slices.Reverse(p.previous)
	return p
}

func usesDeadEnds(rung events.Rung) bool {
	return rung != "" && !strings.EqualFold(string(rung), string(events.RungRefine))
}

// clipEntry shortens an entry to one line of at most maxLineChars, each
// text said once: a failure's summary is usually its error, and what one
// of the two holds whole is not repeated by the other (compared before
// either is clipped: a clipped text is nobody's substring). The default
// step, like the <task> tag's, is not named.
func clipEntry(e history.Entry) history.Entry {
	e.TaskID = "" // which task tried it does not help the next attempt
	if e.Step == events.StepExecute {
		e.Step = ""
	}
	summary, errText := oneLine(e.Summary), oneLine(e.Error)
	switch {
	case errText != "" && strings.Contains(errText, summary):
		summary = ""
	case summary != "" && strings.Contains(summary, errText):
		errText = ""
	}
	e.Approach = clip(oneLine(e.Approach), maxLineChars/3)
	e.Error = clip(errText, maxLineChars-len(e.Approach))
	e.Summary = clip(summary, maxLineChars-len(e.Approach)-len(e.Error))
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

// gist is what an error says, up to case, punctuation, spacing and
// numbers (ladder.Normalize less its digits): the same failure at another
// try, line or count has the same gist. A text with fewer than minGist
// characters besides its numbers is kept with them: "HTTP 404" and "HTTP
// 500" say different things.
func gist(s string) string {
	n := ladder.Normalize(s)
	g := strings.Join(strings.Fields(strings.Map(func(r rune) rune {
		if unicode.IsDigit(r) {
			return ' '
		}
		return r
	}, n)), " ")
	if len(g) < minGist {
		return n
	}
	return g
}

// minGist: a text whose words besides its numbers are shorter than this
// is compared with its numbers (gist).
const minGist = 24

// oneLine collapses runs of white space to single spaces.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
