package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Decision is a human action as recorded.
type Decision struct {
	Action events.Action `json:"action"`
	// Task is the task state after the action; nil for a review record
	// without a task (rejected input), whose decision is the event alone.
	Task *events.TaskState `json:"task,omitempty"`
	// Already: the same decision had been taken before (a repeated cancel);
	// nothing changed.
	Already bool `json:"already,omitempty"`
}

// Resolve records that a human fixed the task: status succeeded.
func (c *Client) Resolve(ctx context.Context, id, note, by string) (Decision, error) {
	return c.decide(ctx, events.ActionResolve, id, note, by)
}

// Reject records that the task is not worth doing: status failed.
func (c *Client) Reject(ctx context.Context, id, note, by string) (Decision, error) {
	return c.decide(ctx, events.ActionReject, id, note, by)
}

// Requeue sends the task through the pipeline again with a fresh round of
// attempts: status pending, RoundStart = Attempts, Pass+1, and a
// task.retry.v1 whose Run carries the note (for the prompt), Reviewed (the
// gate lets it through), the dead ends and the last error. The retry's
// Nats-Msg-Id is salted, so the stream's deduplication never swallows it.
func (c *Client) Requeue(ctx context.Context, id, note, by string) (Decision, error) {
	return c.decide(ctx, events.ActionRequeue, id, note, by)
}

// BulkResult says what RequeueWhere did to each task.
type BulkResult struct {
	Requeued []string `json:"requeued"`
	// Skipped are open items whose task could not be requeued, with why.
	Skipped []Skipped `json:"skipped"`
}

// Skipped is a task a bulk requeue left alone.
type Skipped struct {
	ID  string `json:"id"`
	Why string `json:"why"`
}

// RequeueWhere requeues the task of every open review item of the type and
// reason (at least one of them is required), once per task: RequeueEach,
// with what it did collected.
func (c *Client) RequeueWhere(ctx context.Context, taskType, reason, note, by string) (BulkResult, error) {
	res := BulkResult{Requeued: []string{}, Skipped: []Skipped{}}
	err := c.RequeueEach(ctx, taskType, reason, note, by, func(id string, skipped error) {
		if skipped != nil {
			res.Skipped = append(res.Skipped, Skipped{ID: id, Why: skipped.Error()})
		} else {
			res.Requeued = append(res.Requeued, id)
		}
	})
	return res, err
}

// DefaultBy names the human at this terminal: $USER@host.
func DefaultBy() string {
	name := os.Getenv("USER")
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	if name == "" {
		name = "unknown"
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	return name + "@" + host
}

func validateInput(note, by string) error {
	var errs []error
	if strings.TrimSpace(note) == "" {
		errs = append(errs, fmt.Errorf("%w: a note is required: say why (a requeue's note reaches the next prompt)", ErrInvalid))
	}
	if len(note) > MaxNoteLen {
		errs = append(errs, fmt.Errorf("%w: the note is %d bytes, limit %d", ErrInvalid, len(note), MaxNoteLen))
	}
	if strings.TrimSpace(by) == "" {
		errs = append(errs, fmt.Errorf("%w: who acts is required", ErrInvalid))
	}
	if err := ValidateBy(by); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ValidateBy checks a reviewer name: at most MaxByLen bytes, no control
// characters (the web page checks the name it saves with it too).
func ValidateBy(by string) error {
	if len(by) > MaxByLen || strings.ContainsFunc(by, unicode.IsControl) {
		return fmt.Errorf("%w: reviewer name %q must be at most %d printable characters", ErrInvalid, textcut.Clip(by, 40), MaxByLen)
	}
	return nil
}

// DecideSeen carries out action (resolve, reject or requeue) as its
// method does, unless another human decided on the task after the decider
// looked: seen is how many decisions the task held then (len of
// Detail.Task.Actions, Item.Decisions). The decision is then refused with a
// *DecidedError naming the newer one. A negative seen checks nothing.
func (c *Client) DecideSeen(ctx context.Context, action, id, note, by string, seen int) (Decision, error) {
	switch action {
	case events.ActionResolve, events.ActionReject, events.ActionRequeue:
	default:
		return Decision{}, fmt.Errorf("%w: action %q (resolve, reject or requeue)", ErrInvalid, action)
	}
	return c.decideSeen(ctx, action, id, note, by, seen)
}

// decide carries out one human action.
func (c *Client) decide(ctx context.Context, action, id, note, by string) (Decision, error) {
	return c.decideSeen(ctx, action, id, note, by, -1)
}

func (c *Client) decideSeen(ctx context.Context, action, id, note, by string, seenDecisions int) (Decision, error) {
	if !events.ValidID(id) {
		return Decision{}, fmt.Errorf("%w: task id %q", ErrInvalid, id)
	}
	note, by = strings.TrimSpace(note), strings.TrimSpace(by)
	if err := validateInput(note, by); err != nil {
		return Decision{}, err
	}
	tasks, err := c.taskStore(ctx)
	if err != nil {
		return Decision{}, err
	}
	entries, err := c.Timeline(ctx, id)
	if err != nil {
		return Decision{}, err
	}
	a := events.Action{TaskID: id, Action: action, Note: note, By: by, At: c.cfg.Now().UTC()}
	salt := nuid.Next()

	seen, err := tasks.Get(ctx, id)
	if errors.Is(err, services.ErrTaskNotFound) {
		return c.decideRecord(ctx, a, salt, entries)
	}
	if err != nil {
		return Decision{}, err
	}
	t := tailOf(entries)
	if seenDecisions >= 0 && len(seen.Actions) > seenDecisions {
		// Another human decided since the decider looked: name them
		// before anything else (theirs may have ended the task).
		return Decision{}, &DecidedError{ID: id, Action: action, Latest: seen.Actions[len(seen.Actions)-1]}
	}
	if err := checkReviewable(seen, t, action); err != nil {
		return Decision{}, err
	}
	var requeued events.Task
	if action == events.ActionRequeue {
		if requeued, err = requeueTask(entries, id); err != nil {
			return Decision{}, err
		}
	}

	// From here on the decision commits: a browser that goes away or a
	// Ctrl-C must not cut it in half (state written, retry not published).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	var prev events.TaskState
	next, err := tasks.Update(ctx, id, func(cur *events.TaskState, found bool) error {
		if !found {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		if seenDecisions >= 0 && len(cur.Actions) > seenDecisions {
			return &DecidedError{ID: id, Action: action, Latest: cur.Actions[len(cur.Actions)-1]}
		}
		// A status outside ReviewStatuses was judged halted from the
		// stream: it must still be the very state that was judged.
		if !slices.Contains(ReviewStatuses, cur.Status) && (cur.Status != seen.Status || cur.Pass != seen.Pass) {
			return &StateError{ID: id, Action: action, Status: cur.Status, Pass: cur.Pass}
		}
		if err := checkReviewable(*cur, t, action); err != nil {
			return err
		}
		prev = *cur
		*cur = task.Act(*cur, a) // as dispatch rebuild replays it
		return nil
	})
	if err != nil {
		return Decision{}, err
	}

	// The action record goes first, so every event the decision causes
	// comes after it on the stream. If the retry then cannot be published,
	// the state is restored without the action, and the record on the
	// stream stays void: List and Show count only decisions the task
	// state holds.
	if err := c.publishAction(ctx, a, salt); err != nil {
		return Decision{}, c.revert(ctx, tasks, prev, next, fmt.Errorf("%s of %s did not take effect: %w", action, id, err))
	}
	if action == events.ActionRequeue {
		if err := c.publishRetry(ctx, next, requeued, a, salt); err != nil {
			return Decision{}, c.revert(ctx, tasks, prev, next, fmt.Errorf("requeue of %s did not take effect (its action record is void): %w", id, err))
		}
	}
	c.cfg.Log.Info("human review action", "task", id, "action", action, "by", by, "note", textcut.Clip(note, 200), "status", next.Status)
	return Decision{Action: a, Task: &next}, nil
}

// decideRecord handles an id with review records but no task state: the
// action event on the stream is the whole decision.
func (c *Client) decideRecord(ctx context.Context, a events.Action, salt string, entries []timeline.Entry) (Decision, error) {
	var last uint64 // the newest record, and whether a decision came after it
	var handled *events.Action
	for _, e := range entries {
		switch {
		case e.Stage == "review."+ReasonAction:
			var d events.Action
			if json.Unmarshal(e.Data, &d) == nil && e.Seq > last {
				handled = &d
			}
		case strings.HasPrefix(e.Stage, "review."):
			last, handled = e.Seq, nil
		}
	}
	if last == 0 {
		return Decision{}, fmt.Errorf("%w: %s", ErrNotFound, a.TaskID)
	}
	if a.Action == events.ActionRequeue {
		return Decision{}, fmt.Errorf("%w %s: the input never became a task, so it cannot be requeued; fix it and submit it again, then resolve or reject this record", ErrNoTask, a.TaskID)
	}
	if handled != nil {
		return Decision{}, &StateError{ID: a.TaskID, Action: a.Action, Already: handled}
	}
	if err := c.publishAction(ctx, a, salt); err != nil {
		return Decision{}, err
	}
	c.cfg.Log.Info("human review action", "record", a.TaskID, "action", a.Action, "by", a.By, "note", textcut.Clip(a.Note, 200))
	return Decision{Action: a}, nil
}

// RequeueReason is the reason a requeue's retry event and task state carry.
func RequeueReason(a events.Action) string { return fmt.Sprintf("requeued by %s: %s", a.By, a.Note) }

// RequeueMsgID is the Nats-Msg-Id of a requeue's retry: the deterministic id
// of the pass's retry, salted, so an id still in the deduplication window
// (a retry the recorder published for the same pass) never swallows it.
func RequeueMsgID(taskID string, pass int, salt string) string {
	return services.MsgID(taskID, pass, events.StageRetry) + ":requeue:" + salt
}

// revert undoes a decision whose event could not be published, unless the
// task has moved since.
func (c *Client) revert(ctx context.Context, tasks *services.TaskStore, prev, wrote events.TaskState, cause error) error {
	// The publish may have failed because ctx ended: revert on a fresh deadline.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := tasks.Update(rctx, prev.ID, func(cur *events.TaskState, _ bool) error {
		if cur.Pass != wrote.Pass || cur.Status != wrote.Status || len(cur.Actions) != len(wrote.Actions) {
			return kvcas.ErrNoChange
		}
		*cur = prev
		return nil
	})
	if err != nil {
		return errors.Join(cause, fmt.Errorf("and the task state could not be restored: %w", err))
	}
	return cause
}

// publishRetry sends the requeued task back to the verifier.
func (c *Client) publishRetry(ctx context.Context, st events.TaskState, task events.Task, a events.Action, salt string) error {
	b := events.Base{
		Task: task,
		Run: events.Run{
			Pass: st.Pass, Attempt: st.Attempts + 1, Rung: events.RungRefine, Step: st.Step,
			StepInput: st.StepInputs[st.Step], // the step resumes with the input it ran with
			Context:   st.LastError, Note: a.Note, Reviewed: true, DeadEnds: st.DeadEnds,
		},
		At: a.At, By: a.By, PolicyRev: c.cfg.Policy.Rev(),
	}
	ev := events.Retry{Base: b, Reason: RequeueReason(a)}
	return c.publish(ctx, events.TaskSubject(st.ID, events.StageRetry), RequeueMsgID(st.ID, st.Pass, salt), events.EventRetry, a, ev)
}

// publishAction puts the decision on dispatch.review.action.<id>.
func (c *Client) publishAction(ctx context.Context, a events.Action, salt string) error {
	return c.publish(ctx, events.ReviewSubject(ReasonAction, a.TaskID), "action:"+a.TaskID+":"+salt, events.EventAction, a, a)
}

// publish stores one event, retrying a failed publish with the same
// Msg-Id (a retry of a publish that did land is deduplicated).
func (c *Client) publish(ctx context.Context, subject, msgID, name string, a events.Action, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", name, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(events.HeaderEvent, name)
	msg.Header.Set(events.HeaderTaskID, a.TaskID)
	if r, ok := v.(events.Retry); ok {
		msg.Header.Set(events.HeaderPass, strconv.Itoa(r.Run.Pass))
	}
	msg.Header.Set(events.HeaderService, "human:"+a.By)
	for try := 1; ; try++ {
		_, err = c.cfg.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID))
		if err == nil || try == 3 || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try) * 200 * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("publish %s on %s: %w", name, subject, err)
	}
	return nil
}
