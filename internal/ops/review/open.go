package review

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// OpenCounts is how many review items wait for a human per reason in the
// whole queue (every type and age; rejections the submit API answered are
// left out): what dispatch_review_queue reports, and the review page's
// tabs. Every reason of Reasons is there, 0 when none is open, and any
// other reason a newer service wrote.
//
// It follows the review subjects instead of listing them: the client keeps
// the open records of each task in memory, and each call reads only the
// records and decisions stored since the last one — one stream info, one
// consumer creation (its pending count says how many are new), a fetch of
// the new ones, headers only, and the consumer's deletion: the same few
// requests on a stream of a hundred records as on one of millions. The
// first call reads the headers of every review record the stream holds,
// once (a call cut short by ctx keeps what it read, and the next goes on
// from there). A record is open until a human decision on its task is
// stored after it (dispatch.review.action.<id>) — what List decides from
// the task's state, except for a decision whose effect was undone (its
// requeue could not be published: the page said so, and the state kept
// no trace of it), which closes the task's records here. Records older
// than the stream keeps are gone from the counts as from List; a stream
// that was deleted and created again is read again from its start.
func (c *Client) OpenCounts(ctx context.Context) (map[string]int, error) {
	c.mu.Lock()
	if c.open == nil {
		c.open = newOpenQueue()
	}
	o := c.open
	c.mu.Unlock()
	return o.sync(ctx, c.cfg.JS, c.cfg.Stream)
}

// openQueue is what OpenCounts keeps between calls.
type openQueue struct {
	mu      sync.Mutex
	created time.Time // when the stream was created: another time means another stream
	next    uint64    // the first sequence not read yet
	// keys are the open records of each key (task id), oldest first.
	keys map[string][]openRecord
	// order is every record counted, oldest first, so that aged-out ones
	// leave the counts; records closed since stay in it (stale) until they
	// reach its front or it is compacted.
	order []keyedSeq
	stale int
	open  map[string]int // per reason
}

type openRecord struct {
	seq    uint64
	reason string
}

type keyedSeq struct {
	seq uint64
	key string
}

func newOpenQueue() *openQueue {
	o := &openQueue{}
	o.reset(time.Time{})
	return o
}

func (o *openQueue) reset(created time.Time) {
	o.created, o.next, o.keys, o.order, o.stale = created, 0, map[string][]openRecord{}, nil, 0
	o.open = map[string]int{}
	for _, r := range Reasons {
		o.open[r] = 0
	}
}

// readBatch bounds one fetch of headers.
const readBatch = 10_000

// sync reads what was stored since the last call and returns a copy of the
// counts.
func (o *openQueue) sync(ctx context.Context, js jetstream.JetStream, name string) (map[string]int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s (is the mesh provisioned?): %w", name, err)
	}
	info := stream.CachedInfo()
	if !info.Created.Equal(o.created) || info.State.LastSeq+1 < o.next {
		o.reset(info.Created) // another stream, or this one purged back to its start
	}
	first := max(info.State.FirstSeq, 1)
	o.ageOut(first)
	o.next = max(o.next, first)
	if info.State.LastSeq < o.next {
		return maps.Clone(o.open), nil
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject: events.ReviewFilter, AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: o.next,
		HeadersOnly: true, InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("review records: %w", err)
	}
	defer func() { _ = stream.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name) }()
	pending := cons.CachedInfo().NumPending
	for pending > 0 {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("review records: %d left to read: %w", pending, err)
		}
		batch, err := cons.FetchNoWait(int(min(pending, readBatch)))
		if err != nil {
			return nil, fmt.Errorf("review records: %w", err)
		}
		n := uint64(0)
		for msg := range batch.Messages() {
			meta, err := msg.Metadata()
			if err != nil {
				continue
			}
			n++
			o.apply(msg, meta.Sequence.Stream)
			o.next = meta.Sequence.Stream + 1
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("review records: %w", err)
		}
		if n == 0 {
			return nil, fmt.Errorf("review records: %d announced, none delivered", pending)
		}
		pending -= min(n, pending)
	}
	// Nothing else on the review subjects was stored up to the stream's
	// end when the consumer was created, which is at or after the info's.
	o.next = max(o.next, info.State.LastSeq+1)
	o.compact()
	return maps.Clone(o.open), nil
}

// apply counts one review message: a record opens an item of its reason,
// a human decision closes every open record of its task.
func (o *openQueue) apply(msg jetstream.Msg, seq uint64) {
	reason, key, ok := events.ParseReviewSubject(msg.Subject())
	switch {
	case !ok:
	case reason == ReasonAction:
		for _, r := range o.keys[key] {
			o.open[r.reason]--
			o.stale++
		}
		delete(o.keys, key)
	case reason == events.ReviewRejected && msg.Headers().Get(events.HeaderOrigSubj) == events.SubmitAPI:
		// answered to its caller: nobody else needs to act (AnsweredRejection)
	case OwnQueue(reason): // dispatch webhooks lists it
	default:
		o.keys[key] = append(o.keys[key], openRecord{seq: seq, reason: reason})
		o.order = append(o.order, keyedSeq{seq: seq, key: key})
		o.open[reason]++
	}
}

// ageOut drops the records the stream no longer holds (below first).
func (o *openQueue) ageOut(first uint64) {
	for len(o.order) > 0 && o.order[0].seq < first {
		ks := o.order[0]
		o.order = o.order[1:]
		recs := o.keys[ks.key]
		if len(recs) == 0 || recs[0].seq != ks.seq { // records of a key age out oldest first
			o.stale--
			continue
		}
		o.open[recs[0].reason]--
		if len(recs) == 1 {
			delete(o.keys, ks.key)
		} else {
			o.keys[ks.key] = recs[1:]
		}
	}
}

// compact drops closed records from order once they are most of it.
func (o *openQueue) compact() {
	if o.stale < 1024 || o.stale < len(o.order)/2 {
		return
	}
	kept := make([]keyedSeq, 0, len(o.order)-o.stale)
	for _, ks := range o.order {
		for _, r := range o.keys[ks.key] {
			if r.seq == ks.seq {
				kept = append(kept, ks)
				break
			}
		}
	}
	o.order, o.stale = kept, 0
}
