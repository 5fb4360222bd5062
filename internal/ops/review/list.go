package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Reasons are the review reasons the mesh writes. A filter also accepts any
// other reason a newer service may write.
var Reasons = []string{events.ReviewRejected, events.ReviewGated, events.ReviewEscalated, events.ReviewPoison, events.ReviewStuck}

// QueueScanFactor bounds a page of the review queue that may read more
// than it lists (Filter.Filtered: open, not answered, a type, or every
// reason with the decisions among them): it reads at most
// Limit × QueueScanFactor messages, and ends early with a cursor when
// fewer of them matched.
const QueueScanFactor = 20

// maxDecisions bounds the human decisions read per task on a page.
const maxDecisions = 1000

// Filter selects review items, one page at a time, newest first. The zero
// value is the newest DefaultPageSize open items of every reason.
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
	// Cursor continues a listing: the Next of the previous page.
	Cursor string
	// Limit is the page size (default DefaultPageSize, at most MaxPageSize).
	Limit int
}

// ListsHeld reports whether the queue's views list the held tasks with
// this page (Queue.Held): on the first page of every reason.
func (f Filter) ListsHeld() bool { return f.Reason == "" && f.Cursor == "" }

// OwnQueue reports whether records of a review reason are left out of the
// human review queue because they have a queue of their own: a webhook
// delivery given up (events.ReviewWebhook) is listed and redelivered by
// `dispatch webhooks`, and closed by a delivery, not by a decision on its
// task.
func OwnQueue(reason string) bool { return reason == events.ReviewWebhook }

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
	if f.Limit < 0 || f.Limit > MaxPageSize {
		errs = append(errs, fmt.Errorf("%w: limit %d (1-%d)", ErrInvalid, f.Limit, MaxPageSize))
	}
	if _, err := parseCursor(f.Cursor); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Filtered reports whether a page may read more than it lists (at most
// Limit × QueueScanFactor): the filter keeps records by what their subject
// does not say (open, not answered, a type), or it names no reason, so the
// page reads the human decisions on the review subjects too.
func (f Filter) Filtered() bool {
	return f.Type != "" || !f.All || f.Reason == "" || (!f.Answered && f.Reason == events.ReviewRejected)
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
	// Decisions is how many human decisions the task's state holds: a
	// decision sent with it (Client.DecideSeen) is refused when another
	// was taken since.
	Decisions int `json:"decisions"`
}

// Open reports whether the item still waits for a human.
func (it Item) Open() bool { return it.Handled == nil }

// Queue is one page of the review queue: the result of List.
type Queue struct {
	// Items match the filter, newest first; handled ones only with
	// Filter.All.
	Items []Item `json:"items"`
	// Next is the cursor of the next (older) page; "" when there is none.
	Next string `json:"next,omitempty"`
	// Scanned is how many messages on the review subjects the page read:
	// as many as it lists unless the filter is Filtered. Without a reason
	// they include the human decisions (dispatch.review.action.<id>),
	// read and skipped.
	Scanned int `json:"scanned"`
	// Open is how many items wait for a human per reason in the whole
	// queue — every type and age, answered rejections left out: what
	// dispatch_review_queue reports (OpenCounts). List leaves it empty;
	// the review page and /api/review fill it.
	Open map[string]int `json:"open,omitempty"`
	// Held are the tasks the gate holds for their type's low trust, from
	// the held index (Client.Held, of Filter.Type), oldest first: they are
	// on no review subject. List leaves it nil; the review page,
	// /api/review and `dispatch review list` fill it on the first page of
	// every reason (Filter.ListsHeld).
	Held *HeldList `json:"held,omitempty"`
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
	return c.retentionOf(s.CachedInfo()), nil
}

// retentionOf reads the limits from a stream's info.
func (c *Client) retentionOf(info *jetstream.StreamInfo) Retention {
	r := Retention{
		Stream: c.cfg.Stream, MaxAge: info.Config.MaxAge, MaxMsgs: info.Config.MaxMsgs, MaxBytes: info.Config.MaxBytes,
		Msgs: info.State.Msgs,
	}
	if info.State.Msgs > 0 {
		r.Oldest = info.State.FirstTime
	}
	return r
}

// List returns one page of the review queue, newest first: the records on
// dispatch.review.<reason>.<key> (every reason, or f.Reason) that match f,
// each with its task's current status and the human decision that
// handled it. Nothing reads the review subjects or the task bucket as a
// whole.
//
// It pages the review subjects as Tasks pages the task index, with the
// same machinery (window.go): the reason is a subject token, so the server
// filters by it; the age is a range of sequences (the server maps a time
// to a sequence); the cursor is the sequence the page stopped at, so pages
// stay put while records arrive. A page of n items costs one stream info;
// one consumer creation for an age; consumer creations whose pending
// count the server computes from its per-subject index, no message sent —
// one for the cursor and one or two to find where the page's newest
// records begin (it settles for up to 2n of them, and does not count the
// records below, so a page that ends just above the oldest record leaves a
// cursor to an empty one); one consumer that delivers the page's records;
// and, per task on the page, one task-state get and, when the task has
// human decisions (or no state), one direct get per decision on
// dispatch.review.action.<id> and one more. Whether a record is open (no
// decision on its task after it), an answered rejection, or of the type is
// decided per record from those reads, as it always was, but only for the
// records of the page: a Filtered page (the default open queue is) reads
// at most n × QueueScanFactor messages and ends early, with a cursor, when
// fewer matched; Scanned says how many it read.
//
// A pending count from a sequence in the older half of the stream makes
// the server walk every subject of the filter in its index (one subject
// per task): a page deep in a stream of a million records costs about a
// second, one near its newest end some tens of milliseconds.
func (c *Client) List(ctx context.Context, f Filter) (Queue, error) {
	if err := f.Validate(); err != nil {
		return Queue{}, err
	}
	if f.Limit == 0 {
		f.Limit = DefaultPageSize
	}
	tasks, err := c.taskStore(ctx)
	if err != nil {
		return Queue{}, err
	}
	stream, err := c.cfg.JS.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return Queue{}, fmt.Errorf("stream %s (is the mesh provisioned?): %w", c.cfg.Stream, err)
	}
	q := Queue{Items: []Item{}, Retention: c.retentionOf(stream.CachedInfo())}
	// One filter: the server counts a wildcard from its per-subject index
	// far faster than a list of filters. Without a reason it takes the
	// human decisions (dispatch.review.action.<id>) too, read and skipped.
	reason := f.Reason
	if reason == "" {
		reason = "*"
	}
	sp := span{stream: stream, filter: events.ReviewSubject(reason, "*"), what: "review records"}
	var since time.Time
	if f.Age > 0 {
		since = c.cfg.Now().Add(-f.Age)
	}
	cursor, _ := parseCursor(f.Cursor)
	w, err := openNewest(ctx, stream, sp, cursor, since)
	if err != nil {
		return q, err
	}
	budget := f.Limit
	if f.Filtered() {
		budget = f.Limit * QueueScanFactor
	}
	jd := &judge{tasks: tasks, stream: stream, keys: map[string]*keyDecisions{}}
	more := func() bool { return len(q.Items) < f.Limit && q.Scanned < budget }
	size := func() (uint64, uint64) {
		want := uint64(f.Limit - len(q.Items))
		if f.Filtered() {
			want = min(uint64(budget-q.Scanned), want*4, MaxPageSize)
		}
		// Up to twice as many as wanted: the search for where they begin
		// then stops about log2(want) pending counts sooner; records carry
		// their bodies, so at most 2 × MaxPageSize are in memory.
		return want, 2 * want
	}
	err = w.walk(ctx, more, size, func(msg jetstream.Msg, _ uint64) error {
		q.Scanned++
		it := Item{Record: record(msg)}
		if it.Reason == ReasonAction || OwnQueue(it.Reason) || (!f.Answered && AnsweredRejection(it.Record)) || (f.Type != "" && it.Type != "" && it.Type != f.Type) {
			return nil // a decision, not an item; or decided without a read
		}
		it, err := jd.item(ctx, it)
		if err != nil {
			return err
		}
		if (f.Type == "" || it.Type == f.Type) && (f.All || it.Open()) {
			q.Items = append(q.Items, it)
		}
		return nil
	})
	if err != nil {
		return q, err
	}
	q.Next = w.next()
	return q, nil
}

// judge reads, once per task of a page, its state and its human decisions
// on the stream, and judges the task's records with them.
type judge struct {
	tasks  *services.TaskStore
	stream jetstream.Stream
	keys   map[string]*keyDecisions
}

type keyDecisions struct {
	state     *events.TaskState // nil: the key has none
	decisions []decision        // the decisions that count
}

// item completes a record with its task's status and the decision that
// handled it. A task's decisions are those its state holds, each placed on
// the stream by its action record (by its time when that record is gone:
// aged out or lost); an action record the state does not hold was undone
// (its requeue could not be published) and does not count. A record
// without a task state (rejected input) is handled by any decision on the
// stream after it.
func (j *judge) item(ctx context.Context, it Item) (Item, error) {
	k, err := j.of(ctx, it.Key)
	if err != nil {
		return it, err
	}
	if st := k.state; st != nil {
		it.TaskID, it.Status, it.Decisions = st.ID, st.Status, len(st.Actions)
		if it.Type == "" {
			it.Type = st.Type
		}
		if it.TaskSubject == "" {
			it.TaskSubject = st.Subject
		}
	}
	it.Handled = handledBy(it.Record, k.decisions)
	return it, nil
}

func (j *judge) of(ctx context.Context, key string) (*keyDecisions, error) {
	if k, ok := j.keys[key]; ok {
		return k, nil
	}
	k := &keyDecisions{}
	if events.ValidID(key) {
		st, err := j.tasks.Get(ctx, key)
		switch {
		case errors.Is(err, services.ErrTaskNotFound):
		case err != nil:
			return nil, fmt.Errorf("task %s: %w", key, err)
		default:
			k.state = &st
		}
	}
	if k.state == nil || len(k.state.Actions) > 0 { // a state without actions has no decision
		fromStream, err := j.streamDecisions(ctx, key)
		if err != nil {
			return nil, err
		}
		k.decisions = fromStream
		if k.state != nil {
			k.decisions = merge(fromStream, k.state.Actions)
		}
	}
	j.keys[key] = k
	return k, nil
}

// streamDecisions reads the decisions on dispatch.review.action.<key>,
// oldest first: one direct get each (the server's next message on a
// literal subject, found from its per-subject index), and one that finds
// none.
func (j *judge) streamDecisions(ctx context.Context, key string) ([]decision, error) {
	subject := events.ReviewSubject(ReasonAction, key)
	var out []decision
	for seq := uint64(1); len(out) < maxDecisions; {
		raw, err := j.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("decisions on %s: %w", key, err)
		}
		var a events.Action
		if json.Unmarshal(raw.Data, &a) == nil {
			out = append(out, decision{seq: raw.Sequence, a: a})
		}
		seq = raw.Sequence + 1
	}
	return out, nil
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
