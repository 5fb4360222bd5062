package recorder

import (
	"fmt"
	"strings"
	"time"

	"dispatchmesh/events"
	"dispatchmesh/internal/ladder"
	"dispatchmesh/internal/policy"
)

// DefaultSkipBudget and DefaultSkipDelay apply when a pipeline's policy sets none.
const (
	DefaultSkipBudget = 2
	DefaultSkipDelay  = 10 * time.Minute
)

// Apply folds one attempt into the task state and decides what comes next
// (st.Decision): it is the whole of the recorder's logic, pure, and what
// `dispatch rebuild` replays. run is the attempt's run context and res its
// (already judged) result.
func Apply(st *events.TaskState, t events.Task, run events.Run, res events.Result, pol policy.Type, now time.Time) {
	success := res.Outcome == events.OutcomeSuccess
	st.History = append(st.History, events.AttemptRecord{
		Attempt: run.Attempt, Pass: run.Pass, Rung: run.Rung, Step: run.Step,
		Approach: res.Approach, Outcome: res.Outcome, Reason: res.Error,
		TokensIn: res.TokensIn, TokensOut: res.TokensOut, Cost: res.Cost, At: now,
		ErrorClass: res.ErrorClass,
	})
	st.Attempts = max(st.Attempts, run.Attempt)
	st.TokensIn += res.TokensIn
	st.TokensOut += res.TokensOut
	st.Cost += res.Cost
	st.UpdatedAt = now
	st.WakeAt = time.Time{}
	if success {
		st.LastError = ""
	} else {
		st.LastError = res.Error
	}

	switch {
	case !success && pol.Budget.Exceeded(st.TokensIn+st.TokensOut, st.Cost):
		st.Status, st.Decision = events.StatusBlocked, events.DecisionHandoff
		st.Reason = fmt.Sprintf("budget: the task spent %d tokens and $%.4f, over its budget", st.TokensIn+st.TokensOut, st.Cost)
	case len(pol.Steps) > 0:
		applyStep(st, run, res, pol, now)
	default:
		applyLadder(st, t, run, res, pol)
	}
	if st.Decision == events.DecisionRetry || st.Decision == events.DecisionPark {
		st.Pass = run.Pass + 1
	}
}

// applyLadder climbs the escalation ladder (SPEC §8).
func applyLadder(st *events.TaskState, t events.Task, run events.Run, res events.Result, pol policy.Type) {
	cfg := ladder.Config{MaxRetries: MaxRetries(t, pol)}
	d := cfg.Next(ladder.State{
		Failed: failedInRound(st, run.Pass), Rung: run.Rung, PivotCount: st.PivotCount, DeadEnds: st.DeadEnds,
	}, ladder.Outcome{
		Attempt: run.Attempt, Success: res.Outcome == events.OutcomeSuccess,
		Approach: res.Approach, Reason: res.Error, ErrorClass: res.ErrorClass,
	})
	st.Rung, st.PivotCount, st.DeadEnds = d.State.Rung, d.State.PivotCount, d.State.DeadEnds
	if res.ErrorClass == events.ErrorClassDeadEnd {
		st.DeadEnds = st.DeadEnds[:len(st.DeadEnds)-1] // a repeat is no new dead end
	}
	switch {
	case res.Outcome == events.OutcomeSuccess:
		st.Status, st.Decision, st.Reason = events.StatusSucceeded, events.DecisionSucceeded, ""
	case d.Handoff():
		st.Status, st.Decision = events.StatusBlocked, events.DecisionHandoff
		st.Reason = fmt.Sprintf("HANDOFF after %d attempts (%s); last error: %s", run.Attempt, d.Reason, oneLine(res.Error))
		if events.DeploymentFault(res.ErrorClass) { // the error says what to fix: it leads
			st.Reason = fmt.Sprintf("%s (HANDOFF after %d attempts: %s)", oneLine(res.Error), run.Attempt, d.Reason)
		}
	default:
		st.Status, st.Decision, st.Reason = events.StatusPending, events.DecisionRetry, ""
	}
}

// applyStep routes a pipeline (SPEC §7).
func applyStep(st *events.TaskState, run events.Run, res events.Result, pol policy.Type, now time.Time) {
	success := res.Outcome == events.OutcomeSuccess
	if !success && events.ShortCircuits(res.ErrorClass) {
		st.Status, st.Decision = events.StatusBlocked, events.DecisionHandoff
		st.Reason = fmt.Sprintf("HANDOFF at step %s (%s failure: retrying cannot help): %s", run.Step, res.ErrorClass, oneLine(res.Error))
		if events.DeploymentFault(res.ErrorClass) { // the error says what to fix: it leads
			st.Reason = fmt.Sprintf("%s (HANDOFF at step %s: %s failure, retrying cannot help)", oneLine(res.Error), run.Step, res.ErrorClass)
		}
		return
	}
	step := run.Step
	if step == "" {
		step = ladder.FirstStep(pol.Steps)
	}
	r := ladder.RouteStep(pol.Steps, ladder.Progress{Step: step, Retries: st.StepRetries, Loops: st.Loops}, success)
	st.Step, st.StepRetries, st.Loops = r.Step, r.Progress.Retries, r.Progress.Loops
	switch r.Action {
	case ladder.ActionDone:
		st.Step = step
		st.Status, st.Decision, st.Reason = events.StatusSucceeded, events.DecisionSucceeded, ""
	case ladder.ActionNext, ladder.ActionRetry, ladder.ActionGoto:
		st.Status, st.Decision, st.Reason = events.StatusPending, events.DecisionRetry, ""
	case ladder.ActionFail:
		st.Step = step
		st.Status, st.Decision = events.StatusFailed, events.DecisionFail
		st.Reason = r.Reason + ": " + oneLine(res.Error)
	case ladder.ActionSkip:
		budget := pol.SkipBudget
		if budget <= 0 {
			budget = DefaultSkipBudget
		}
		if st.Skips >= budget {
			st.Step = step
			st.Status, st.Decision = events.StatusBlocked, events.DecisionStuck
			st.Reason = fmt.Sprintf("stuck: skipped %d times and still failing; %s", st.Skips, r.Reason)
			return
		}
		delay := time.Duration(pol.SkipDelay)
		if delay <= 0 {
			delay = DefaultSkipDelay
		}
		st.Skips++
		st.Step, st.StepRetries, st.Loops = ladder.FirstStep(pol.Steps), nil, nil
		st.Status, st.Decision, st.WakeAt = events.StatusParked, events.DecisionPark, now.Add(delay)
		st.Reason = fmt.Sprintf("parked (skip %d of %d): %s", st.Skips, budget, r.Reason)
	}
}

// failedInRound counts the failed attempts of the current round recorded
// before pass.
func failedInRound(st *events.TaskState, pass int) int {
	n := 0
	for _, r := range st.History {
		if r.Pass < pass && r.Attempt > st.RoundStart && r.Outcome != events.OutcomeSuccess {
			n++
		}
	}
	return n
}

// NextRun is the run context of the attempt after the one in run, given the
// state Apply produced.
func NextRun(st *events.TaskState, run events.Run, res events.Result, pol policy.Type) events.Run {
	next := events.Run{
		Pass: st.Pass, Attempt: st.Attempts + 1, Rung: st.Rung, Step: st.Step,
		LastErrorClass: res.ErrorClass, DeadEnds: st.DeadEnds,
		// A round a human started keeps the human's word: the gate lets
		// it through and the note stays in the prompt.
		Reviewed: run.Reviewed, Note: run.Note,
		// A probe's retries go on re-measuring its blocked type.
		Probe: run.Probe,
	}
	switch {
	case st.Decision == events.DecisionPark:
		next.Rung, next.LastErrorClass = "", ""
	case len(pol.Steps) > 0 && res.Outcome == events.OutcomeSuccess:
		next.Rung, next.LastErrorClass = "", ""
		next.Context = stepOutput(run.Step, res)
	case len(pol.Steps) > 0:
		next.Rung = ""
		next.Context = fmt.Sprintf("step %s failed:\n%s", run.Step, res.Error)
	default:
		next.Context = res.Error
	}
	return next
}

// stepOutput is what a passed step hands the next one.
func stepOutput(step string, res events.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %s passed", step)
	if res.Approach != "" {
		b.WriteString(" (" + res.Approach + ")")
	}
	if res.Summary != "" {
		b.WriteString(":\n" + res.Summary)
	}
	for _, c := range res.Changes {
		b.WriteString("\n- " + c)
	}
	return b.String()
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
