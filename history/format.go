package history

import (
	"strconv"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/internal/core/xmltext"
)

// Entry is the outcome of one attempt on a (task type, subject).
type Entry struct {
	// Key is the idempotency key, e.g. "taskid:pass".
	Key     string      `json:"key"`
	TaskID  string      `json:"task_id"`
	Attempt int         `json:"attempt"`
	Rung    events.Rung `json:"rung,omitempty"`
	Step    string      `json:"step,omitempty"`
	// Outcome is "success" or "failure" (events.OutcomeSuccess, events.OutcomeFailure).
	Outcome  string    `json:"outcome"`
	Approach string    `json:"approach,omitempty"`
	Summary  string    `json:"summary,omitempty"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
}

// Capped is e with its approach, summary and error cut to MaxApproach,
// MaxSummary and MaxError bytes, each cut marked (textcut.Mark).
func (e Entry) Capped() Entry {
	e.Approach = textcut.Cut(e.Approach, MaxApproach)
	e.Summary = textcut.Cut(e.Summary, MaxSummary)
	e.Error = textcut.Cut(e.Error, MaxError)
	return e
}

// Format renders entries as the <previous_attempts> block of a prompt, in the
// given order (oldest first), numbered from 1:
//
//	<previous_attempts>
//	  <attempt n="1" outcome="failure" at="2026-05-18T14:22:00Z" rung="REFINE" task="t1">
//	    Tried adding null check in handleResponse() -- error: wrong location
//	  </attempt>
//	</previous_attempts>
//
// The body is the approach, the summary and the error, the empty ones left
// out. at, rung, step and task appear only when set. Every attribute value and
// the body are escaped, and characters XML cannot carry become U+FFFD, so the
// block is always well-formed. Format returns "" when there are no entries.
func Format(entries []Entry) string {
	if len(entries) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("<previous_attempts>\n")
	for i, e := range entries {
		b.WriteString(`  <attempt n="`)
		b.WriteString(strconv.Itoa(i + 1))
		b.WriteString(`"`)
		attr(&b, "outcome", e.Outcome)
		if !e.At.IsZero() {
			attr(&b, "at", e.At.UTC().Format(time.RFC3339))
		}
		attr(&b, "rung", string(e.Rung))
		attr(&b, "step", e.Step)
		attr(&b, "task", e.TaskID)
		body := e.body()
		if body == "" {
			b.WriteString("/>\n")
			continue
		}
		b.WriteString(">\n    ")
		b.WriteString(xmltext.Escape(body, xmltext.Text))
		b.WriteString("\n  </attempt>\n")
	}
	b.WriteString("</previous_attempts>\n")
	return b.String()
}

// body joins the entry's non-empty texts, each line after the first indented
// to sit under the first.
func (e Entry) body() string {
	var parts []string
	for _, p := range []string{e.Approach, e.Summary, prefixed("error: ", e.Error)} {
		if p = strings.TrimSpace(p); p != "" {
			parts = append(parts, p)
		}
	}
	text := strings.Join(parts, " -- ")
	text = strings.ReplaceAll(text, "\r\n", "\n")
	text = strings.ReplaceAll(text, "\r", "\n")
	return strings.ReplaceAll(text, "\n", "\n    ")
}

func prefixed(prefix, s string) string {
	if s = strings.TrimSpace(s); s == "" {
		return ""
	}
	return prefix + s
}

// attr writes ` name="value"` when value is not empty.
func attr(b *strings.Builder, name, value string) {
	if value == "" {
		return
	}
	b.WriteString(" ")
	b.WriteString(name)
	b.WriteString(`="`)
	b.WriteString(xmltext.Escape(value, xmltext.Attr))
	b.WriteString(`"`)
}
