package review

import (
	"context"
	"errors"
	"fmt"
	"time"

	"dispatchmesh/events"
	"dispatchmesh/services"
)

// Reasons are the review reasons the mesh writes. A filter also accepts any
// other reason a newer service may write.
var Reasons = []string{events.ReviewRejected, events.ReviewGated, events.ReviewEscalated, events.ReviewPoison, events.ReviewStuck}

// Filter selects review items. The zero value lists every open item.
type Filter struct {
	// Reason keeps one review reason ("" keeps all).
	Reason string
	// Type keeps one task type ("" keeps all).
	Type string
	// Age keeps items recorded within this long before now (0 keeps all).
	Age time.Duration
	// All also lists items a human already handled.
	All bool
	// Answered also lists rejected inputs that were already answered to a
	// synchronous caller: the submit API (dispatch.api.submit) replied 400
	// with the problems and kept the rejection. Nobody else needs to act on
	// them, so by default they are left out of the queue and its counts.
	Answered bool
}

// AnsweredRejection reports whether a review record is a rejection the
// submit API already answered to its caller.
func AnsweredRejection(r Record) bool {
	return r.Reason == events.ReviewRejected && r.OrigSubject == events.SubmitAPI
}

// Validate reports a filter that cannot match as the caller meant.
func (f Filter) Validate() error {
	var errs []error
	if f.Reason != "" && (!events.ValidType(f.Reason) || f.Reason == ReasonAction) {
		errs = append(errs, fmt.Errorf("%w: reason %q (the reasons are %v)", ErrInvalid, f.Reason, Reasons))
	}
	if f.Type != "" && !events.ValidType(f.Type) {
		errs = append(errs, fmt.Errorf("%w: task type %q", ErrInvalid, f.Type))
	}
	if f.Age < 0 {
		errs = append(errs, fmt.Errorf("%w: age %s is negative", ErrInvalid, f.Age))
	}
	return errors.Join(errs...)
}

// Item is one record waiting for (or handled by) a human.
type Item struct {
	Record
	// TaskID is the task the record belongs to ("" when the input never
	// became a task).
	TaskID string `json:"task_id,omitempty"`
	// Status is the task's current status ("" without a task).
	Status events.Status `json:"status,omitempty"`
	// Handled is the human decision taken on the task since the record was
	// written; nil while the item is open.
	Handled *events.Action `json:"handled,omitempty"`
}

// Open reports whether the item still waits for a human.
func (it Item) Open() bool { return it.Handled == nil }

// Count is how many items of one reason are open and handled.
type Count struct {
	Open    int `json:"open"`
	Handled int `json:"handled"`
}

// Queue is the result of List.
type Queue struct {
	// Items match the filter, oldest first; handled ones only with Filter.All.
	Items []Item `json:"items"`
	// Counts per reason of every item matching the filter's reason, type and
	// age, open and handled (whether listed or not).
	Counts map[string]Count `json:"counts"`
	// Retention is how long the stream keeps records: older ones are gone.
	Retention Retention `json:"retention"`
}

// Retention describes the stream's limits: nothing is dropped silently, but
// records older than MaxAge (or beyond MaxMsgs/MaxBytes) are removed by
// JetStream.
type Retention struct {
	Stream   string        `json:"stream"`
	MaxAge   time.Duration `json:"max_age"` // 0: unlimited
	MaxMsgs  int64         `json:"max_msgs"`
	MaxBytes int64         `json:"max_bytes"`
	// Msgs is how many messages the stream holds; Oldest is the oldest one's time.
	Msgs   uint64    `json:"msgs"`
	Oldest time.Time `json:"oldest,omitzero"`
}

// String is a one-line summary for people.
func (r Retention) String() string {
	limit := func(n int64, unit string) string {
		if n <= 0 {
			return "unlimited " + unit
		}
		return fmt.Sprintf("at most %d %s", n, unit)
	}
	age := "forever"
	if r.MaxAge > 0 {
		age = "for " + humanDuration(r.MaxAge)
	}
	s := fmt.Sprintf("stream %s keeps records %s, %s, %s; older ones are removed by JetStream",
		r.Stream, age, limit(r.MaxMsgs, "messages"), limit(r.MaxBytes, "bytes"))
	if !r.Oldest.IsZero() {
		s += fmt.Sprintf(" (holds %d, oldest from %s)", r.Msgs, r.Oldest.UTC().Format(time.RFC3339))
	}
	return s
}

func humanDuration(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}

// Retention reads the stream's limits.
func (c *Client) Retention(ctx context.Context) (Retention, error) {
	s, err := c.cfg.JS.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return Retention{}, fmt.Errorf("stream %s (is the mesh provisioned?): %w", c.cfg.Stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return Retention{}, fmt.Errorf("stream %s: %w", c.cfg.Stream, err)
	}
	r := Retention{
		Stream: c.cfg.Stream, MaxAge: info.Config.MaxAge, MaxMsgs: info.Config.MaxMsgs, MaxBytes: info.Config.MaxBytes,
		Msgs: info.State.Msgs,
	}
	if info.State.Msgs > 0 {
		r.Oldest = info.State.FirstTime
	}
	return r, nil
}

// List reads the review subjects and returns the items matching f, each
// with its task's current status and the human decision that handled it.
func (c *Client) List(ctx context.Context, f Filter) (Queue, error) {
	if err := f.Validate(); err != nil {
		return Queue{}, err
	}
	tasks, err := c.taskStore(ctx)
	if err != nil {
		return Queue{}, err
	}
	ret, err := c.Retention(ctx)
	if err != nil {
		return Queue{}, err
	}
	filters := []string{events.ReviewFilter}
	if f.Reason != "" {
		filters = []string{events.ReviewRoot + "." + f.Reason + ".>", events.ReviewRoot + "." + ReasonAction + ".>"}
	}
	recs, err := c.records(ctx, filters...)
	if err != nil {
		return Queue{}, err
	}

	decisions := map[string][]decision{}
	var items []Item
	for _, r := range recs {
		if r.Reason == ReasonAction {
			if r.Action != nil {
				decisions[r.Key] = append(decisions[r.Key], decision{seq: r.Seq, a: *r.Action})
			}
			continue
		}
		items = append(items, Item{Record: r})
	}

	// One state read per task.
	states := map[string]*events.TaskState{}
	for _, it := range items {
		if _, seen := states[it.Key]; seen || !events.ValidID(it.Key) {
			continue
		}
		st, err := tasks.Get(ctx, it.Key)
		switch {
		case errors.Is(err, services.ErrTaskNotFound):
			states[it.Key] = nil
		case err != nil:
			return Queue{}, fmt.Errorf("task %s: %w", it.Key, err)
		default:
			states[it.Key] = &st
		}
	}

	since := time.Time{}
	if f.Age > 0 {
		since = c.cfg.Now().Add(-f.Age)
	}
	q := Queue{Items: []Item{}, Counts: map[string]Count{}, Retention: ret}
	for _, it := range items {
		if st := states[it.Key]; st != nil {
			it.TaskID, it.Status = st.ID, st.Status
			if it.Type == "" {
				it.Type = st.Type
			}
			if it.TaskSubject == "" {
				it.TaskSubject = st.Subject
			}
			it.Handled = handledBy(it.Record, merge(decisions[it.Key], st.Actions))
		} else {
			it.Handled = handledBy(it.Record, decisions[it.Key])
		}
		if (f.Type != "" && it.Type != f.Type) || it.Time.Before(since) || (!f.Answered && AnsweredRejection(it.Record)) {
			continue
		}
		cnt := q.Counts[it.Reason]
		if it.Open() {
			cnt.Open++
		} else {
			cnt.Handled++
		}
		q.Counts[it.Reason] = cnt
		if it.Open() || f.All {
			q.Items = append(q.Items, it)
		}
	}
	return q, nil
}

// decision is a human action and, when read from the stream, its sequence.
type decision struct {
	seq uint64 // 0: known only from the task state
	a   events.Action
}

// merge places the task state's decisions on the stream: a decision read
// from the stream takes its sequence; one known only from the state (its
// record aged out or was lost) is placed by its time. A record on the
// stream that the state does not hold was undone (its requeue could not
// be published) and does not count.
func merge(fromStream []decision, fromState []events.Action) []decision {
	out := make([]decision, 0, len(fromState))
	for _, a := range fromState {
		d := decision{a: a}
		for _, s := range fromStream {
			if s.a.Action == a.Action && s.a.By == a.By && s.a.At.Equal(a.At) {
				d.seq = s.seq
				break
			}
		}
		out = append(out, d)
	}
	return out
}

// handledBy returns the first decision taken after the record was written.
// Stream sequences order decisions read from the stream; a decision known
// only from the task state is placed by its time.
func handledBy(r Record, ds []decision) *events.Action {
	var best *decision
	for i := range ds {
		d := &ds[i]
		after := d.seq > r.Seq || (d.seq == 0 && !d.a.At.Before(r.Time))
		if !after {
			continue
		}
		if best == nil || d.a.At.Before(best.a.At) {
			best = d
		}
	}
	if best == nil {
		return nil
	}
	a := best.a
	return &a
}
