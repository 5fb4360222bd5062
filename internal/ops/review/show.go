package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Detail is everything a reviewer needs to decide about one task.
type Detail struct {
	ID string `json:"id"`
	// Task is the task's current state; nil when the id names only a review
	// record (input that never became a task).
	Task *events.TaskState `json:"task,omitempty"`
	// Why says in one line why the task stopped (or what it is doing).
	Why string `json:"why"`
	// Trust is the trust score of the task's type, as the gate sees it.
	Trust *TrustView `json:"trust,omitempty"`
	// Attempts is every attempt: rung, approach, outcome, reason, tokens, cost.
	Attempts []events.AttemptRecord `json:"attempts"`
	// DeadEnds are the approaches that failed and must not be repeated.
	DeadEnds []events.DeadEnd `json:"dead_ends"`
	// Records are the task's review records and human decisions, oldest first.
	Records []Record `json:"records"`
	// Actions are the human decisions recorded in the task state.
	Actions []events.Action `json:"actions"`
	// Actionable is true when a human can resolve, reject or requeue now;
	// otherwise NotActionable says why.
	Actionable    bool   `json:"actionable"`
	CanRequeue    bool   `json:"can_requeue"`
	NotActionable string `json:"not_actionable,omitempty"`
	// NoRequeue says why an actionable task cannot be requeued (no event
	// on the stream holds a task that can be sent again).
	NoRequeue string `json:"no_requeue,omitempty"`
}

// TrustView is one task type's trust score with its recent outcomes.
type TrustView struct {
	Type        string  `json:"type"`
	Score       float64 `json:"score"`
	Outcomes    int     `json:"outcomes"`
	Threshold   float64 `json:"threshold"`
	MinOutcomes int     `json:"min_outcomes"`
	Exempt      bool    `json:"exempt,omitempty"`
	// Gated is true while the gate blocks the type's tasks; Reason says why.
	Gated  bool   `json:"gated"`
	Reason string `json:"reason,omitempty"`
	// Successes and Failures are counted in the scoring window.
	Successes   int `json:"successes"`
	Failures    int `json:"failures"`
	BlockStreak int `json:"block_streak"`
	// Recent are the newest outcomes in the scoring window, oldest first.
	Recent []trust.Outcome `json:"recent"`
}

// RecentOutcomes is how many outcomes a TrustView lists.
const RecentOutcomes = 20

// view scores st as the gate does: the type's policy threshold and exemption
// override the scoring defaults.
func (c *Client) view(st trust.Stats) TrustView {
	pol := c.cfg.Policy.For(st.Type)
	scoring := pol.Scoring(c.cfg.Scoring).WithDefaults() // as the gate scores it (an explicit threshold 0 never gates)
	scoring.Exempt = []string{}
	v := scoring.Evaluate(st.Type, st)
	recent := st.Outcomes
	if len(recent) > RecentOutcomes {
		recent = recent[len(recent)-RecentOutcomes:]
	}
	tv := TrustView{
		// A threshold of 0 never gates; the scoring holds it as -1 (below
		// every score): shown as the policy says it.
		Type: st.Type, Score: v.Score, Outcomes: v.Outcomes, Threshold: max(v.Threshold, 0), MinOutcomes: scoring.MinOutcomes,
		Exempt: pol.IsExempt(), Successes: v.Successes, Failures: v.Failures, BlockStreak: st.BlockStreak,
		Recent: append([]trust.Outcome{}, recent...),
	}
	tv.Gated = v.Below && !tv.Exempt
	if tv.Gated {
		tv.Reason = v.Reason
	}
	return tv
}

// TrustOf returns the trust view of one task type.
func (c *Client) TrustOf(ctx context.Context, taskType string) (TrustView, error) {
	if !events.ValidType(taskType) {
		return TrustView{}, fmt.Errorf("%w: task type %q", trust.ErrInvalid, taskType)
	}
	_, view, err := c.stores(ctx)
	if err != nil {
		return TrustView{}, err
	}
	return c.view(view.Stats(taskType)), nil
}

// Trust returns the trust view of every task type with outcomes, by type.
func (c *Client) Trust(ctx context.Context) ([]TrustView, error) {
	_, view, err := c.stores(ctx)
	if err != nil {
		return nil, err
	}
	all := view.All()
	out := make([]TrustView, 0, len(all))
	for _, st := range all {
		out = append(out, c.view(st))
	}
	return out, nil
}

// Timeline returns every event of the task stored on the stream, in order:
// task events, review records, human decisions and webhook deliveries. It reads what
// timeline.Follow reads, as timeline.Entry values, but stops as soon as the
// stored events are read (a non-live Follow waits up to a second for more).
func (c *Client) Timeline(ctx context.Context, id string) ([]timeline.Entry, error) {
	if !events.ValidID(id) {
		return nil, fmt.Errorf("%w: task id %q", ErrInvalid, id)
	}
	all := []timeline.Entry{}
	err := read(ctx, c.cfg.JS, c.cfg.Stream, timeline.Filters(id), func(m jetstream.Msg) {
		all = append(all, timeline.FromMsg(m))
	})
	return all, err
}

// Show returns the full record of one task (or review record key).
func (c *Client) Show(ctx context.Context, id string) (Detail, error) {
	if !events.ValidID(id) {
		return Detail{}, fmt.Errorf("%w: task id %q", ErrInvalid, id)
	}
	tasks, err := c.taskStore(ctx)
	if err != nil {
		return Detail{}, err
	}
	d := Detail{ID: id, Attempts: []events.AttemptRecord{}, DeadEnds: []events.DeadEnd{}, Actions: []events.Action{}}
	st, err := tasks.Get(ctx, id)
	switch {
	case errors.Is(err, services.ErrTaskNotFound):
	case err != nil:
		return Detail{}, err
	default:
		d.Task = &st
	}
	if d.Records, err = c.records(ctx, events.ReviewTaskFilter(id)); err != nil {
		return Detail{}, err
	}
	if d.Records == nil {
		d.Records = []Record{}
	}
	if d.Task == nil && len(d.Records) == 0 {
		return Detail{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if d.Task == nil {
		d.Why = whyRecord(d.Records)
		d.Actionable = handledBy(lastStop(d.Records), decisionsOf(d.Records)) == nil
		d.NotActionable = "no task state: the input never became a task; it can be resolved or rejected, not requeued (fix it and submit again)"
		if !d.Actionable {
			d.NotActionable = "already handled"
		}
		return d, nil
	}
	d.Attempts = append(d.Attempts, st.History...)
	d.DeadEnds = append(d.DeadEnds, st.DeadEnds...)
	d.Actions = append(d.Actions, st.Actions...)
	if tv, err := c.TrustOf(ctx, st.Type); err == nil {
		d.Trust = &tv
	} else if !errors.Is(err, trust.ErrInvalid) {
		return Detail{}, err
	}
	entries, err := c.Timeline(ctx, id)
	if err != nil {
		return Detail{}, err
	}
	t := tailOf(entries)
	if err := checkReviewable(st, t, events.ActionResolve); err != nil {
		d.NotActionable = err.Error()
	} else {
		d.Actionable, d.CanRequeue = true, true
		if _, err := requeueTask(entries, id); err != nil {
			d.CanRequeue, d.NoRequeue = false, err.Error()
		}
	}
	d.Why = why(st, d.Records, t)
	return d, nil
}

// why is the one line a newcomer reads first: the status and the reason
// for it, else the error of the review record the task stopped at (t is the
// task's newest event).
func why(st events.TaskState, recs []Record, t tail) string {
	parts := []string{}
	r := lastStop(recs)
	stoppedAt := r.Error != "" && t.Stage == "review."+r.Reason
	if stoppedAt && halted(st, t) && !slices.Contains(ReviewStatuses, st.Status) {
		// The status is what the pipeline last wrote; the record says why
		// nothing moves (its message was dead-lettered).
		parts = append(parts, "stopped by "+r.Reason+": "+r.Error)
		stoppedAt = false
	}
	if st.Reason != "" {
		parts = append(parts, st.Reason)
	}
	if st.LastError != "" && !strings.Contains(st.Reason, st.LastError) {
		parts = append(parts, "last error: "+st.LastError)
	}
	if len(parts) == 0 && stoppedAt {
		parts = append(parts, r.Error)
	}
	if len(parts) == 0 && st.Status == events.StatusSucceeded && len(st.History) > 0 {
		parts = append(parts, fmt.Sprintf("on attempt %d", st.History[len(st.History)-1].Attempt))
	}
	if len(parts) == 0 {
		return string(st.Status)
	}
	return string(st.Status) + ": " + strings.Join(parts, "; ")
}

func whyRecord(recs []Record) string {
	r := lastStop(recs)
	return r.Reason + ": " + r.Error
}

// lastStop is the newest record that is not a human decision.
func lastStop(recs []Record) Record {
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Reason != ReasonAction {
			return recs[i]
		}
	}
	return Record{}
}

func decisionsOf(recs []Record) []decision {
	var ds []decision
	for _, r := range recs {
		if r.Reason == ReasonAction && r.Action != nil {
			ds = append(ds, decision{seq: r.Seq, a: *r.Action})
		}
	}
	return ds
}

// tail is the newest event of a task: its stage and pass (0: unknown).
type tail struct {
	Stage string
	Pass  int
}

// tailOf reads the pass of the newest event from its Dispatch-Pass header,
// else from its body: a dead-lettered body often does not decode.
func tailOf(entries []timeline.Entry) tail {
	if len(entries) == 0 {
		return tail{}
	}
	e := entries[len(entries)-1]
	if e.Pass > 0 {
		return tail{Stage: e.Stage, Pass: e.Pass}
	}
	var v struct {
		Run events.Run `json:"run"`
	}
	_ = json.Unmarshal(e.Data, &v)
	return tail{Stage: e.Stage, Pass: v.Run.Pass}
}

// taskOf finds the task itself (payload included) in its events, newest first.
func taskOf(entries []timeline.Entry, id string) (events.Task, bool) {
	for i := len(entries) - 1; i >= 0; i-- {
		var v struct {
			Task events.Task `json:"task"`
		}
		if json.Unmarshal(entries[i].Data, &v) == nil && v.Task.ID == id && v.Task.Type != "" {
			return v.Task, true
		}
	}
	return events.Task{}, false
}

// requeueTask is the task a requeue sends again, or why there is none (an
// error matching ErrNoTask): resolve and reject still work.
func requeueTask(entries []timeline.Entry, id string) (events.Task, error) {
	if task, ok := taskOf(entries, id); ok {
		return task, nil
	}
	why := "its events have aged out of the stream, so its payload is gone"
	for _, e := range entries {
		if !strings.HasPrefix(e.Stage, "review.") {
			why = "none of its events on the stream can be decoded, so there is nothing to send again (see its poison record)"
			break
		}
		if e.Stage == "review."+events.ReviewPoison {
			why = "it stopped before intake queued it (its submission was dead-lettered), so no event holds it"
		}
	}
	return events.Task{}, fmt.Errorf("%w: cannot requeue task %s: %s; resolve or reject it, and submit it again", ErrNoTask, id, why)
}
