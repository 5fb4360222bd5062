package task

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

// DefaultSkipBudget and DefaultSkipDelay apply when a pipeline's policy sets none.
const (
	DefaultSkipBudget = 2
	DefaultSkipDelay  = 10 * time.Minute
)

// Record: the recorder folds the outcome res of the attempt of pass
// b.Run.Pass into the state and decides what comes next (st.Decision; SPEC
// §7, §8). It returns the result as judged (Judge): a redelivery returns
// the judgement recorded on the first delivery (CauseRedelivered); an
// outcome of an earlier pass, or of a task that ended while its model
// answered (a human cancelled it), is never recorded (CauseMovedOn,
// CauseEnded). now dates the attempt: when the stream stored the outcome.
func Record(st events.TaskState, found bool, b events.Base, res events.Result, pol policy.Type, now time.Time) (events.TaskState, events.Result, Cause) {
	if !found {
		st = New(b.Task)
	}
	if r, ok := recordOf(&st, b.Run.Pass); ok {
		res.Outcome, res.Error, res.ErrorClass = r.Outcome, r.Reason, r.ErrorClass // judged when first recorded
		return st, res, CauseRedelivered
	}
	if c, ok := guard(st, b.Run.Pass); !ok {
		return st, res, c
	}
	// PIVOT judges against the dead ends the attempt's prompt showed (the
	// run carries them): the model is refused only for repeating what it
	// was told.
	res = Judge(b.Run, res, b.Run.DeadEnds, len(pol.Steps) > 0)
	st = cloneState(st)
	Apply(&st, b.Task, b.Run, res, pol, now)
	return st, res, CauseApplied
}

// Apply folds one attempt into the task state and decides what comes next
// (st.Decision): the ladder or the pipeline's routing. run is the
// attempt's run context and res its (already judged) result. Record calls
// it under the guard.
func Apply(st *events.TaskState, t events.Task, run events.Run, res events.Result, pol policy.Type, now time.Time) {
	success := res.Outcome == events.OutcomeSuccess
	st.History = append(st.History, events.AttemptRecord{
		Attempt: run.Attempt, Pass: run.Pass, Rung: run.Rung, Step: run.Step,
		Approach: res.Approach, Outcome: res.Outcome, Reason: res.Error,
		TokensIn: res.TokensIn, TokensOut: res.TokensOut, Cost: res.Cost, At: now,
		ErrorClass: res.ErrorClass, Model: cmp.Or(res.Route, res.Model),
	})
	st.History = KeptAttempts(st.History, st.RoundStart)
	st.Attempts = max(st.Attempts, run.Attempt)
	st.Unbilled = events.Usage{} // the Result billed what the attempt's cut-short tries spent
	st.TokensIn += res.TokensIn
	st.TokensOut += res.TokensOut
	st.Cost += res.Cost
	st.UpdatedAt = now
	st.WakeAt = time.Time{}
	st.Cause = "" // the gate let the attempt through: whatever it stopped before is over
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

// applyLadder climbs the escalation ladder (SPEC §8). The dead ends of
// earlier tasks on the subject that the run was shown (a recurring start
// on PIVOT) become the task's too, so its later attempts are shown them.
func applyLadder(st *events.TaskState, t events.Task, run events.Run, res events.Result, pol policy.Type) {
	st.DeadEnds = withEarlier(st.DeadEnds, run.DeadEnds)
	cfg := ladder.Config{MaxRetries: MaxRetries(t, pol), RefineAttempts: pol.RefineAttempts, PivotAttempts: pol.PivotAttempts}
	d := cfg.Next(ladder.State{
		Failed: failedInRound(st, run.Pass), Rung: run.Rung, PivotCount: st.PivotCount, DeadEnds: st.DeadEnds,
		RoundStart: st.RoundStart,
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

// applyStep routes a pipeline (SPEC §7). A step follows its own on_fail
// policy for every failure but the deployment's (a refused key, a quota, a
// tool that does not answer: retrying cannot help) — a step that timed out
// too: a flaky test is what "retry 1, then goto implement" is for.
func applyStep(st *events.TaskState, run events.Run, res events.Result, pol policy.Type, now time.Time) {
	success := res.Outcome == events.OutcomeSuccess
	if !success && events.DeploymentFault(res.ErrorClass) {
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
	case ladder.ActionNext:
		// What the step hands the next is kept: a go-back to that one
		// later gives it the same input.
		st.StepInputs = maps.Clone(st.StepInputs)
		if st.StepInputs == nil {
			st.StepInputs = map[string]string{}
		}
		st.StepInputs[r.Step] = stepOutput(step, res)
		st.Status, st.Decision, st.Reason = events.StatusPending, events.DecisionRetry, ""
	case ladder.ActionRetry, ladder.ActionGoto:
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
		st.Step, st.StepRetries, st.Loops, st.StepInputs = ladder.FirstStep(pol.Steps), nil, nil, nil
		st.Status, st.Decision, st.WakeAt = events.StatusParked, events.DecisionPark, now.Add(delay)
		st.Reason = fmt.Sprintf("parked (skip %d of %d): %s", st.Skips, budget, r.Reason)
	}
}

// withEarlier is ends with the dead ends of earlier tasks (attempt 0)
// among shown that it lacks put first.
func withEarlier(ends, shown []events.DeadEnd) []events.DeadEnd {
	var earlier []events.DeadEnd
	for _, d := range shown {
		if d.Attempt > 0 || slices.ContainsFunc(ends, func(e events.DeadEnd) bool {
			return ladder.Normalize(e.Approach) == ladder.Normalize(d.Approach)
		}) {
			continue
		}
		earlier = append(earlier, d)
	}
	if len(earlier) == 0 {
		return ends
	}
	return append(earlier, ends...)
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
		// A probe's retries go on re-measuring its blocked type; a
		// re-admitted task's go on measuring the held backlog.
		Probe: run.Probe, Readmitted: run.Readmitted,
	}
	switch {
	case st.Decision == events.DecisionPark:
		next.Rung, next.LastErrorClass = "", ""
	case len(pol.Steps) > 0 && res.Outcome == events.OutcomeSuccess:
		next.Rung, next.LastErrorClass = "", ""
		next.StepInput = stepOutput(run.Step, res)
	case len(pol.Steps) > 0:
		next.Rung = ""
		next.Context = fmt.Sprintf("step %s failed:\n%s", run.Step, res.Error)
		// A retry of the step, or a go-back to an earlier one, runs with
		// the input that step was handed: the error comes with its input,
		// never instead of it.
		next.StepInput = StepInput(*st, next.Step)
		if next.StepInput == "" && next.Step == run.Step {
			next.StepInput = run.StepInput // a state kept before StepInputs
		}
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

// oneLine is s on one line, its runs of white space single spaces, cut
// to 300 bytes (and "…"): an error quoted in a reason.
func oneLine(s string) string {
	return textcut.Clip(strings.Join(strings.Fields(s), " "), 300)
}

// Judge applies the PIVOT rule: an answer whose declared approach repeats a
// dead end is rejected — a failed attempt, not progress. deadEnds are those
// the attempt's prompt showed (Run.DeadEnds).
func Judge(run events.Run, res events.Result, deadEnds []events.DeadEnd, pipeline bool) events.Result {
	if pipeline || run.Rung != events.RungPivot {
		return res
	}
	if d, ok := ladder.RepeatsDeadEnd(res.Approach, deadEnds); ok {
		which := fmt.Sprintf("the dead end of attempt %d", d.Attempt)
		if d.Attempt == 0 {
			which = "the dead end of an earlier task on this subject"
		}
		why := fmt.Sprintf("rejected: approach %q repeats %s (%s); PIVOT requires a different approach",
			res.Approach, which, oneLine(d.Reason))
		if res.Outcome == events.OutcomeFailure && res.Error != "" {
			// What the attempt found out stays for the next prompt.
			why += "; the attempt itself failed: " + res.Error
		}
		res.Outcome, res.ErrorClass, res.Error = events.OutcomeFailure, events.ErrorClassDeadEnd, why
	}
	return res
}

// MaxRetries is the attempt limit of a task: its type's
// (policy.DefaultMaxRetries when the policy sets none), or the task's own
// when that is lower. A client may ask for fewer attempts than its type
// allows, never more: the type's limit is what the policy lets a task of
// the type spend.
func MaxRetries(t events.Task, pol policy.Type) int {
	limit := pol.MaxRetries
	if limit <= 0 {
		limit = policy.DefaultMaxRetries
	}
	if t.MaxRetries > 0 {
		return min(t.MaxRetries, limit)
	}
	return limit
}

// TrustOutcome is what an attempt adds to its type's trust stats: st is
// the task's state once the attempt is recorded (Record), which says
// whether the attempt ended the task.
func TrustOutcome(key string, st events.TaskState, run events.Run, res events.Result, at time.Time) scoring.Outcome {
	return scoring.Outcome{
		Key: key, Task: st.ID, Success: res.Outcome == events.OutcomeSuccess, At: at,
		Tokens: res.TokensIn + res.TokensOut, Cost: res.Cost,
		Rung: run.Rung, Retry: run.Attempt > 1, Probe: run.Probe, Held: run.Readmitted,
		End: Ends(st.Decision),
	}
}

// Ends reports whether decision ends the task: it succeeded, or its ladder
// or pipeline gave up. A retry or a park goes on.
func Ends(d events.Decision) bool {
	switch d {
	case events.DecisionSucceeded, events.DecisionHandoff, events.DecisionFail, events.DecisionStuck:
		return true
	}
	return false
}

// CountsForTrust reports whether an outcome says something about how well
// the type's tasks go. Failures the model did not cause — a provider that
// stayed unavailable, a request refused before it was sent, and every fault
// of the deployment (events.DeploymentFault: a bad API key, an exhausted
// quota, a misconfigured model, a tool that does not answer) — must not get
// a type gated.
func CountsForTrust(res events.Result) bool { return modelsOwn(res) }

// modelsOwn reports whether an outcome is the model's own doing: a success,
// or a failure that is neither a provider that stayed unavailable, nor a
// request refused before it was sent, nor a fault of the deployment.
func modelsOwn(res events.Result) bool {
	if res.Outcome == events.OutcomeSuccess {
		return true
	}
	switch {
	case res.ErrorClass == events.ErrorClassTransient, res.ErrorClass == events.ErrorClassRefused,
		events.DeploymentFault(res.ErrorClass):
		return false
	}
	return true
}

// OneLine is s on one line, clipped to 300 bytes: how an error is quoted
// in a reason.
func OneLine(s string) string { return oneLine(s) }

// KeepEarlierAttempts is how many attempt records of the rounds before the
// current one a task state keeps: a round has at most its type's
// max_retries attempts, but a human may requeue a task without end, and
// the state must stay far below the 1 MB a KV value may hold. Every
// attempt stays on the stream (dispatch task shows them all).
const KeepEarlierAttempts = 16

// KeptAttempts is history with the oldest records of the rounds before the
// one that began after attempt roundStart dropped, past
// KeepEarlierAttempts. The current round's are all kept: the ladder counts
// them.
func KeptAttempts(history []events.AttemptRecord, roundStart int) []events.AttemptRecord {
	earlier := 0
	for earlier < len(history) && history[earlier].Attempt <= roundStart {
		earlier++
	}
	if earlier <= KeepEarlierAttempts {
		return history
	}
	return history[earlier-KeepEarlierAttempts:]
}

func recordOf(st *events.TaskState, pass int) (events.AttemptRecord, bool) {
	for _, r := range st.History {
		if r.Pass == pass {
			return r, true
		}
	}
	return events.AttemptRecord{}, false
}

// lastRecord is the latest attempt recorded in st, if any.
func lastRecord(st events.TaskState) (events.AttemptRecord, bool) {
	if len(st.History) == 0 {
		return events.AttemptRecord{}, false
	}
	return st.History[len(st.History)-1], true
}

// cloneState copies the slices Apply appends to, so the state passed in is
// never written through: the transitions are pure.
func cloneState(st events.TaskState) events.TaskState {
	st.History = slices.Clone(st.History)
	st.DeadEnds = slices.Clone(st.DeadEnds)
	st.StepInputs = maps.Clone(st.StepInputs)
	return st
}

// DailySpend is what an attempt adds to its type's spend counters of the
// day (trust.Spending): the units the type's daily budget caps — tokens,
// cost or both — and nothing for a type without one. The counters exist
// for the gate's daily budget alone, so a type nobody caps costs no
// counter messages; a budget set during a day counts from then on.
func DailySpend(res events.Result, budget *policy.Budget) (tokens int, cost float64) {
	if budget == nil {
		return 0, 0
	}
	if budget.Tokens > 0 {
		tokens = res.TokensIn + res.TokensOut
	}
	if budget.Cost > 0 {
		cost = res.Cost
	}
	return tokens, cost
}

// StepInput is the input a pipeline step was last handed by the step
// before it ("" for the first step, or before it was reached).
func StepInput(st events.TaskState, step string) string { return st.StepInputs[step] }
