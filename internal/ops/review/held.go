package review

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// HeldLimit is how many held tasks a listing of the held index returns:
// the oldest ones.
const HeldLimit = 100

// HeldScan bounds the messages a listing of the held index reads: the
// entries of held passes and the removal markers of passes no longer held
// (each kept for services.HeldMarkerTTL). A listing that stops there is
// not Complete.
const HeldScan = 10_000

// Where a held task's hand-off time comes from (HeldList.HoldTimeFrom).
const (
	// HoldTimeFromPolicy: the type's hold_time in the policy in force
	// (the default, trust.DefaultHoldTime, when the policy sets none), as
	// the gate reads it.
	HoldTimeFromPolicy = "policy"
	// HoldTimeFromDefault: the client follows no policy; the hold time is
	// its Config.Scoring's, trust.DefaultHoldTime unless set. A type's
	// hold_time in the policy may differ.
	HoldTimeFromDefault = "default"
)

// HeldItem is a task the gate holds for its type's low trust (status
// held; not terminal, no tokens spent): one entry of the held index.
type HeldItem struct {
	TaskID string `json:"task_id"`
	Type   string `json:"type"`
	Pass   int    `json:"pass"`
	// Retry: the held pass is a retry (its type's trust is judged on
	// settled tasks only).
	Retry bool `json:"retry,omitempty"`
	// Since is when the gate first held the pass.
	Since time.Time `json:"since"`
	// Reason is the gate's.
	Reason string `json:"reason,omitempty"`
	// HoldTime is the type's hold time (HeldList.HoldTimeFrom says where
	// it comes from).
	HoldTime time.Duration `json:"hold_time"`
	// ToHuman is Since + HoldTime: when the gate hands the task to a human
	// (status needs_human_review, a review.gated record) unless its type
	// recovered first. The gate's sweeper acts on it at its next sweep.
	ToHuman time.Time `json:"to_human"`
	// Note says what ends the hold by itself: "re-admitted when <type>
	// recovers".
	Note string `json:"note"`
	// Status is the task's current status ("" when its state is gone).
	Status events.Status `json:"status,omitempty"`
	// Decisions is how many human decisions the task's state holds (as
	// Item.Decisions: a decision sent with it is refused when another was
	// taken since).
	Decisions int `json:"decisions"`
}

// HeldList is what Client.Held read of the held index.
type HeldList struct {
	// Items are the oldest held tasks (of the type), oldest first: at most
	// HeldLimit, less those whose task has moved on (MovedOn).
	Items []HeldItem `json:"items"`
	// Total is how many entries the listing found in the index (of the
	// type): every held pass when Complete.
	Total int `json:"total"`
	// Complete: the listing read the whole index (of the type). Else it
	// stopped after HeldScan messages: Total counts the entries among
	// them, and Items are the oldest of those (the index is read in the
	// order the gate wrote it, which is the order of Since but for a few
	// seconds of look latency).
	Complete bool `json:"complete"`
	// Scanned is how many messages the listing read: the entries and the
	// removal markers of passes no longer held.
	Scanned int `json:"scanned"`
	// MovedOn is how many of the oldest entries are not listed because
	// their task is no longer held at that pass: a human acted on it, or
	// the gate decided it and its entry was not removed yet. The gate
	// removes such an entry at its next look at the pass.
	MovedOn int `json:"moved_on,omitempty"`
	// Waiting counts the passes of the index read that wait for their
	// type's canaries or their turn (not held: their status is unchanged).
	Waiting int `json:"waiting,omitempty"`
	// HoldTimeFrom is where the items' hold times come from:
	// HoldTimeFromPolicy or HoldTimeFromDefault.
	HoldTimeFrom string `json:"hold_time_from"`
}

// Held lists the tasks the gate holds for their type's low trust (every
// type, or taskType), oldest first, from the held index (bucket
// dispatch_held, services.HeldIndex): at most HeldLimit of them, each with
// when it goes to a human (Since + its type's hold time, from the policy
// when the client follows one, see HoldTimeFrom).
//
// It costs one listing of the index — one push consumer on the bucket's
// stream, the newest message of each key, filtered by type on the server,
// at most HeldScan messages read, deleted when done — and one task-state
// get per entry read, oldest first, until HeldLimit are listed: a task a
// human already acted on (its entry stays until the gate's next look at
// the pass) is left out. It
// reads no other task state. Its user needs read access to the bucket
// (stream info, consumer create and delete, flow control), never
// $KV.dispatch_held.>.
func (c *Client) Held(ctx context.Context, taskType string) (HeldList, error) {
	if taskType != "" && !events.ValidType(taskType) {
		return HeldList{}, fmt.Errorf("%w: task type %q", ErrInvalid, taskType)
	}
	entries, scanned, complete, err := c.listHeld(ctx, taskType)
	if err != nil {
		return HeldList{}, err
	}
	tasks, err := c.taskStore(ctx)
	if err != nil {
		return HeldList{}, err
	}
	// Passes waiting for their type's canaries or their turn sleep in the
	// index too, but are not held: counted apart, not listed.
	waiting := len(entries)
	entries = slices.DeleteFunc(entries, func(e services.HeldEntry) bool { return !e.ForTrust() })
	waiting -= len(entries)
	slices.SortFunc(entries, func(a, b services.HeldEntry) int {
		return cmp.Or(a.Since.Compare(b.Since), strings.Compare(a.Key(), b.Key()))
	})
	hl := HeldList{Items: []HeldItem{}, Total: len(entries), Complete: complete, Scanned: scanned, HoldTimeFrom: HoldTimeFromPolicy,
		Waiting: waiting}
	if c.cfg.Policy == nil {
		hl.HoldTimeFrom = HoldTimeFromDefault
	}
	// The oldest HeldLimit still held: entries of tasks a human acted on
	// are passed over (at most HeldScan task reads in all).
	for i, e := range entries {
		if len(hl.Items) >= HeldLimit || i >= HeldScan {
			break
		}
		it := HeldItem{
			TaskID: e.Task, Type: e.Type, Pass: e.Pass, Retry: e.Retry, Since: e.Since, Reason: e.Reason,
			HoldTime: c.holdTime(e.Type),
			Note:     fmt.Sprintf("re-admitted when %s recovers", e.Type),
		}
		it.ToHuman = it.Since.Add(it.HoldTime)
		st, err := tasks.Get(ctx, e.Task)
		switch {
		case errors.Is(err, services.ErrTaskNotFound): // aged out: the index says it is held
		case err != nil:
			return hl, fmt.Errorf("held task %s: %w", e.Task, err)
		case st.Status != events.StatusHeld || st.Pass != e.Pass:
			hl.MovedOn++
			continue
		default:
			it.Status, it.Decisions = st.Status, len(st.Actions)
			if it.Reason == "" {
				it.Reason = st.Reason
			}
		}
		hl.Items = append(hl.Items, it)
	}
	return hl, nil
}

// holdTime is how long the gate holds a task of taskType before handing it
// to a human, as the gate reads it (services/gate dueOf).
func (c *Client) holdTime(taskType string) time.Duration {
	return c.cfg.Policy.For(taskType).Scoring(c.cfg.Scoring).WithDefaults().HoldTime
}

// listHeld reads the held index (of taskType, or every type) in the order
// it was written, the newest message of each key: the entries of held
// passes, skipping the removal markers, until it has read every message or
// HeldScan of them. An entry whose value cannot be decoded is listed from
// its key alone (no reason); a key that is not an entry is skipped.
func (c *Client) listHeld(ctx context.Context, taskType string) (entries []services.HeldEntry, scanned int, complete bool, err error) {
	pre := "$KV." + services.BucketHeld + "."
	filter := pre + ">"
	if taskType != "" {
		filter = pre + taskType + ".>"
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	finished := false
	finish := func(all bool) { // on the follower's goroutine (or in follow.Stream)
		if !finished {
			finished, complete = true, all
			close(done)
		}
	}
	// Only what the listing's own consumer delivered reaches fn
	// (follow.Stream), in stream order, on one goroutine.
	f, err := follow.Stream(lctx, c.cfg.JS, follow.Config{
		Stream:        events.KVStream(services.BucketHeld),
		Filters:       []string{filter},
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		FlowControl:   true,
		CaughtUp:      func() { finish(true) },
		Log:           c.cfg.Log,
	}, func(m follow.Msg) {
		if finished {
			return
		}
		scanned++
		if key, ok := strings.CutPrefix(m.Subject, pre); ok && m.Header.Get("KV-Operation") == "" && m.Header.Get(jetstream.MarkerReasonHeader) == "" {
			if e, ok := heldEntry(key, m.Data); ok {
				entries = append(entries, e)
			}
		}
		if scanned >= HeldScan {
			finish(false)
		}
	})
	if err != nil {
		return nil, 0, false, fmt.Errorf("held index %s (is the mesh provisioned? run `dispatch up`): %w", services.BucketHeld, err)
	}
	select {
	case <-done:
	case <-f.Done():
	case <-ctx.Done():
	}
	f.Stop()
	<-f.Done() // fn is not called after: what it wrote is ours
	if !finished {
		if ctx.Err() != nil {
			return nil, 0, false, fmt.Errorf("held index %s: %w", services.BucketHeld, ctx.Err())
		}
		return nil, 0, false, fmt.Errorf("held index %s: the listing stopped before the end (connection closed)", services.BucketHeld)
	}
	return entries, scanned, complete, nil
}

// heldEntry reads one entry of the held index; ok is false for a key that
// is not one.
func heldEntry(key string, data []byte) (services.HeldEntry, bool) {
	typ, since, id, pass, ok := services.ParseHeldKey(key)
	if !ok {
		return services.HeldEntry{}, false
	}
	if e, err := services.DecodeHeldEntry(key, data); err == nil {
		return e, true
	}
	return services.HeldEntry{Task: id, Type: typ, Pass: pass, Since: since}, true
}
