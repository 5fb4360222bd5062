package web

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

// causeText says a gate cause (events.TrustDecision.Cause) for people.
var causeText = map[events.Cause]string{
	events.CauseTrusted:  "the type's trust score is at or above its threshold",
	events.CauseUnproven: "too few outcomes to score the type: let through as one of its first (canary) tasks",
	events.CauseExempt:   "the type is exempt from the gate",
	events.CauseReviewed: "a human requeued it, so the gate lets it through",
	events.CauseProbe:    "an exploration probe through a blocked type",
	events.CauseTrust:    "the type's trust score is below its threshold",
	events.CauseBudget:   "the type spent its daily budget",
	events.CauseRungRate: "retries on the next rung rarely succeed for this type",
}

// gateDecision is one decision of the gate on the task, with its cause.
type gateDecision struct {
	Time      time.Time
	Pass      int
	Verdict   string // admitted, held, gated (sent to a human)
	Cause     events.Cause
	Explain   string
	Score     float64
	Threshold float64
	Outcomes  int
	Reason    string
}

// gateOf reads the gate's decision an entry holds: false unless it is an
// admitted, held or gated event.
func gateOf(e review.AuditEntry) (gateDecision, bool) {
	verdict := map[string]string{events.StageAdmitted: "admitted", events.StageHeld: "held", "review." + events.ReviewGated: "sent to a human"}[e.Stage]
	if verdict == "" {
		return gateDecision{}, false
	}
	var v struct {
		Run    events.Run           `json:"run"`
		Trust  events.TrustDecision `json:"trust"`
		Reason string               `json:"reason"`
	}
	if json.Unmarshal(e.Data, &v) != nil {
		return gateDecision{}, false
	}
	g := gateDecision{Time: e.Time, Pass: v.Run.Pass, Verdict: verdict, Cause: v.Trust.Cause, Score: v.Trust.Score,
		Threshold: v.Trust.Threshold, Outcomes: v.Trust.Outcomes, Reason: v.Reason}
	if g.Pass == 0 {
		g.Pass = e.Pass
	}
	if g.Reason == "" {
		g.Reason = v.Trust.Reason
	}
	g.Explain = causeText[g.Cause]
	if g.Cause == "" {
		g.Explain = "no cause recorded (an event from before the gate recorded one)"
		if v.Trust.Exempt {
			g.Explain = causeText[events.CauseExempt]
		} else if v.Trust.Probe {
			g.Explain = causeText[events.CauseProbe]
		}
	}
	return g, true
}

// attemptRow is one attempt: what the task state recorded of it and, when
// its event is still on the stream, what the model answered.
type attemptRow struct {
	events.AttemptRecord
	Answer *review.Answer
}

// attemptRows joins the state's attempts with the answers by pass and
// attempt; an answer without an attempt record is a row of its own.
func attemptRows(attempts []events.AttemptRecord, answers []review.Answer) []attemptRow {
	used := make([]bool, len(answers))
	rows := make([]attemptRow, 0, len(attempts))
	for _, a := range attempts {
		r := attemptRow{AttemptRecord: a}
		for i := range answers {
			if !used[i] && answers[i].Pass == a.Pass && answers[i].Attempt == a.Attempt {
				used[i], r.Answer = true, &answers[i]
				break
			}
		}
		rows = append(rows, r)
	}
	for i := range answers {
		if !used[i] {
			an := answers[i]
			rows = append(rows, attemptRow{Answer: &answers[i], AttemptRecord: events.AttemptRecord{
				Attempt: an.Attempt, Pass: an.Pass, Rung: an.Rung, Step: an.Step, Approach: an.Approach, Outcome: an.Outcome,
				Reason: an.Error, TokensIn: an.TokensIn, TokensOut: an.TokensOut, Cost: an.Cost, At: an.At,
			}})
		}
	}
	return rows
}

// finalAnswer is the answer a page leads with: the last successful one,
// else the last one (ok false).
func finalAnswer(answers []review.Answer) (*review.Answer, bool) {
	for i := len(answers) - 1; i >= 0; i-- {
		if answers[i].Outcome == events.OutcomeSuccess {
			return &answers[i], true
		}
	}
	if len(answers) > 0 {
		return &answers[len(answers)-1], false
	}
	return nil, false
}

// ending says who ended the task: a human (which one) or the model.
type ending struct {
	Human  bool
	By     string
	Action string
	Note   string
	At     time.Time
	Text   string
}

func endingOf(st *events.TaskState, final *review.Answer, finalOK bool) *ending {
	if st == nil {
		return nil
	}
	var last *events.Action
	if n := len(st.Actions); n > 0 {
		last = &st.Actions[n-1]
	}
	human := func(verb string) *ending {
		return &ending{Human: true, By: last.By, Action: last.Action, Note: last.Note, At: last.At,
			Text: fmt.Sprintf("%s by a human, %s", verb, last.By)}
	}
	switch st.Status {
	case events.StatusSucceeded:
		if last != nil && last.Action == events.ActionResolve {
			return human("Resolved")
		}
		e := &ending{Text: "Solved by the model"}
		if final != nil && finalOK {
			e.By, e.At = final.Model, final.At
			e.Text = fmt.Sprintf("Solved by the model %s in attempt %d (pass %d)", final.Model, final.Attempt, final.Pass)
			if final.Simulated {
				e.Text += ", simulated"
			}
		}
		return e
	case events.StatusFailed:
		if last != nil && last.Action == events.ActionReject {
			return human("Rejected")
		}
	case events.StatusCancelled:
		if last != nil && last.Action == events.ActionCancel {
			return human("Cancelled")
		}
		return &ending{Text: "Cancelled by the mesh: " + textcut.Clip(st.Reason, 200)}
	}
	return nil
}

// readable is a timeline entry as a sentence.
func readable(e review.AuditEntry) string {
	var v struct {
		Run          events.Run            `json:"run"`
		Verification *events.Verification  `json:"verification"`
		Trust        *events.TrustDecision `json:"trust"`
		Prompt       *events.Prompt        `json:"prompt"`
		Result       *events.Result        `json:"result"`
		Reason       string                `json:"reason"`
		Hold         events.Hold           `json:"hold"`
		Task         events.Task           `json:"task"`
	}
	_ = json.Unmarshal(e.Data, &v)
	clip := func(s string, n int) string { return textcut.Clip(strings.ReplaceAll(s, "\n", " "), n) }
	var s string
	switch e.Stage {
	case events.StageQueued:
		s = fmt.Sprintf("Queued: %s on %s", v.Task.Type, v.Task.Subject)
	case events.StageRetry:
		s = "Sent again: " + clip(v.Reason, 200)
	case events.StageVerified:
		s = "Verified"
		if ver := v.Verification; ver == nil || ver.Verifier == "" || ver.Verifier == "none" {
			s = fmt.Sprintf("Queued: %s on %s (no verifier for this type)", v.Task.Type, v.Task.Subject)
		} else {
			s = fmt.Sprintf("Verified: %s by %s", v.Verification.Verdict, v.Verification.Verifier)
			if v.Verification.Detail != "" {
				s += " — " + clip(v.Verification.Detail, 160)
			}
		}
	case events.StageAdmitted, events.StageHeld:
		g, _ := gateOf(e)
		s = fmt.Sprintf("The gate %s it (%s: %s; trust %.2f, threshold %.2f, %d outcomes)", g.Verdict, orDash(string(g.Cause)), g.Explain, g.Score, g.Threshold, g.Outcomes)
		if e.Stage == events.StageHeld && v.Reason != "" {
			s += " — " + clip(v.Reason, 160)
		}
	case events.StageWake:
		s = "The gate looked at the held task again"
	case events.StagePrompted:
		s = "Prompt built"
		if v.Prompt != nil {
			s = fmt.Sprintf("Prompt built (%d messages)", len(v.Prompt.Messages))
			if v.Prompt.Model != "" {
				s = fmt.Sprintf("Prompt built for %s (%d messages)", v.Prompt.Model, len(v.Prompt.Messages))
			}
		}
	case events.StageExecuted:
		s = "The model answered"
		if r := v.Result; r != nil {
			s = fmt.Sprintf("The model %s answered: %s", r.Model, r.Outcome)
			if r.Approach != "" {
				s += " — " + clip(r.Approach, 160)
			}
			if r.Error != "" {
				s += " — error: " + clip(r.Error, 160)
			}
		}
	case events.StageSucceeded:
		s = "Succeeded"
	case events.StageCancelled:
		s = "Cancelled: " + clip(v.Reason, 200)
	case "review." + review.ReasonAction:
		s = "Human decision: " + e.Summary
	case "review." + events.ReviewGated:
		g, _ := gateOf(e)
		s = fmt.Sprintf("The gate sent it to a human (%s: %s) — %s", orDash(string(g.Cause)), g.Explain, clip(v.Reason, 200))
	default:
		if strings.HasPrefix(e.Stage, "review.") {
			s = fmt.Sprintf("Sent to a human (%s): %s", strings.TrimPrefix(e.Stage, "review."), clip(orDash(v.Reason+e.Error), 200))
		} else {
			s = e.Stage + ": " + e.Summary
		}
	}
	if v.Run.Attempt > 0 && e.Stage != events.StageQueued {
		s = fmt.Sprintf("%s · attempt %d, pass %d", s, v.Run.Attempt, max(v.Run.Pass, e.Pass))
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
