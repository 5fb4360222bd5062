package review

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Paging a stream newest first, without reading it as a whole: what the
// task explorer (Tasks) and the review queue (List) share.
//
// The messages of a page are those on some subjects (the filters) in a
// range of stream sequences [lo, hi). Stream order is the order they were
// stored, so newest first is descending sequence; the cursor of the next
// page is the sequence the page stopped at, so pages stay put while new
// messages arrive. A time bound becomes a sequence (the server maps a time
// to a sequence), and how many messages lie at or after a sequence is a
// consumer creation whose NumPending the server computes from its
// per-subject index: no message is read or sent to count them.

// The cursor is the stream sequence below which the next page starts, in
// base 36: opaque to callers, stable across pages (new messages do not
// shift it).
func formatCursor(seq uint64) string { return strconv.FormatUint(seq, 36) }

func parseCursor(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 36, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%w: cursor %q", ErrInvalid, s)
	}
	return n, nil
}

// span is the messages of a stream on one subject filter. (One filter:
// with several, the server tests every subject of the stream against them
// to count what is pending, where one is looked up in its index.)
type span struct {
	stream jetstream.Stream
	filter string
	what   string // names the messages in errors: "task index", "review records"
}

// probe creates a consumer of the span at a start position, returns what
// the server says about it, and deletes it: the server computes NumPending
// (messages from the start on) from its per-subject index, no message moves.
func (s span) probe(ctx context.Context, cfg jetstream.ConsumerConfig) (*jetstream.ConsumerInfo, error) {
	cfg.FilterSubject = s.filter
	cfg.AckPolicy = jetstream.AckNonePolicy
	cfg.MemoryStorage = true
	cfg.InactiveThreshold = 30 * time.Second // cleans up after a failed delete
	cons, err := s.stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.what, err)
	}
	info := cons.CachedInfo()
	_ = s.stream.DeleteConsumer(context.WithoutCancel(ctx), info.Name)
	return info, nil
}

// pending is how many messages have a sequence at or after seq.
func (s span) pending(ctx context.Context, seq uint64) (uint64, error) {
	info, err := s.probe(ctx, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq})
	if err != nil {
		return 0, err
	}
	return info.NumPending, nil
}

// seqAt is the first sequence stored at or after t (after the last one
// when none is).
func (s span) seqAt(ctx context.Context, t time.Time) (uint64, error) {
	info, err := s.probe(ctx, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t})
	if err != nil {
		return 0, err
	}
	return info.Delivered.Stream + 1, nil
}

// start finds a sequence in [lo, hi) where between want and most of the
// messages before hi begin, above being the messages at or after hi, and
// returns it with how many messages lie from it to hi: a galloping search
// down from hi, then a binary search, each step one pending count,
// stopping at the first sequence whose count is in [want, most]. With
// most = want it finds where exactly the newest want begin; a wider range
// saves probes (about log2(want) of them) for reading a few more
// messages. When no more than most lie in [lo, hi), it returns lo.
func (s span) start(ctx context.Context, lo, hi, above, want, most uint64) (uint64, uint64, error) {
	count := func(seq uint64) (uint64, error) {
		n, err := s.pending(ctx, seq)
		if n < above {
			return 0, err // messages aged out meanwhile
		}
		return n - above, err
	}
	// Galloping: [low, high) holds the answer; count(high) < want.
	high, step := hi, want
	low, lowN, found := lo, uint64(0), false
	for hi-lo > step {
		seq := hi - step
		n, err := count(seq)
		if err != nil {
			return 0, 0, err
		}
		if n >= want {
			if n <= most {
				return seq, n, nil
			}
			low, lowN, found = seq, n, true
			break
		}
		high, step = seq, step*2
	}
	if !found {
		n, err := count(lo)
		if err != nil || n <= most {
			return lo, n, err
		}
		lowN = n
	}
	// Binary search: the largest seq in [low, high) with count(seq) >=
	// want, or the first met with a count in [want, most].
	for high-low > 1 {
		mid := low + (high-low)/2
		n, err := count(mid)
		if err != nil {
			return 0, 0, err
		}
		switch {
		case n >= want && n <= most:
			return mid, n, nil
		case n >= want:
			low, lowN = mid, n
		default:
			high = mid
		}
	}
	return low, lowN, nil
}

// read returns up to want messages from start on, below hi, oldest first,
// with their stream sequences.
func (s span) read(ctx context.Context, start, hi, want uint64) ([]jetstream.Msg, []uint64, error) {
	cfg := jetstream.ConsumerConfig{
		AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
		InactiveThreshold: 30 * time.Second, FilterSubject: s.filter,
	}
	cons, err := s.stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.what, err)
	}
	defer func() { _ = s.stream.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name) }()
	batch, err := cons.FetchNoWait(int(want))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.what, err)
	}
	var msgs []jetstream.Msg
	var seqs []uint64
	for msg := range batch.Messages() {
		meta, err := msg.Metadata()
		if err != nil || meta.Sequence.Stream >= hi {
			continue
		}
		msgs, seqs = append(msgs, msg), append(seqs, meta.Sequence.Stream)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return nil, nil, fmt.Errorf("%s: %w", s.what, err)
	}
	return msgs, seqs, nil
}

// window is what is left of a newest-first walk over a span: the messages
// in [lo, hi) not visited yet.
type window struct {
	span
	lo, hi uint64
	above  uint64 // messages of the span at or after hi
	// left is how many messages of the span lie in [lo, hi); uncounted (a
	// window of openNewest) until a batch reaches lo.
	left uint64
}

// uncounted is the left of a window that has not counted its messages.
const uncounted = math.MaxUint64

// openWindow bounds a walk over the span of stream: below the cursor
// (0: from the newest message), from since (zero: the oldest) and before
// until (zero: open). Its cost: one consumer creation per time bound and
// two pending counts.
func openWindow(ctx context.Context, stream jetstream.Stream, sp span, cursor uint64, since, until time.Time) (*window, error) {
	w, err := bound(ctx, stream, sp, cursor, since, until)
	if err != nil || w.left == 0 {
		return w, err
	}
	total, err := sp.pending(ctx, w.lo)
	if err != nil {
		return nil, err
	}
	w.left = total - min(w.above, total)
	return w, nil
}

// openNewest bounds a walk as openWindow does (without until), but does
// not count the messages in it: counting from the start of a stream costs
// the server a walk over every subject of the span in its per-subject
// index (300 ms for a million distinct subjects), when counting from near
// its end costs about a millisecond. Its left is uncounted, so its next
// is a cursor until a batch finds where the messages end (and counts what
// is left then); a page that ends just above the oldest message leaves a
// cursor to an empty page.
func openNewest(ctx context.Context, stream jetstream.Stream, sp span, cursor uint64, since time.Time) (*window, error) {
	return bound(ctx, stream, sp, cursor, since, time.Time{})
}

// bound is the window of openWindow with its messages uncounted (0 when
// the bounds leave none).
func bound(ctx context.Context, stream jetstream.Stream, sp span, cursor uint64, since, until time.Time) (*window, error) {
	info := stream.CachedInfo()
	w := &window{span: sp, lo: max(info.State.FirstSeq, 1), hi: info.State.LastSeq + 1, left: uncounted}
	if cursor > 0 && cursor < w.hi {
		w.hi = cursor
	}
	if !until.IsZero() {
		seq, err := sp.seqAt(ctx, until)
		if err != nil {
			return nil, err
		}
		w.hi = min(w.hi, seq)
	}
	if !since.IsZero() {
		seq, err := sp.seqAt(ctx, since)
		if err != nil {
			return nil, err
		}
		w.lo = max(w.lo, seq)
	}
	if w.hi <= w.lo {
		w.left = 0
		return w, nil
	}
	var err error
	if w.above, err = sp.pending(ctx, w.hi); err != nil {
		return nil, err
	}
	return w, nil
}

// batch reads the newest want messages still in the window (at most as
// many as are left), oldest first: a search for where they begin, then one
// consumer that delivers exactly them. It returns none when the messages
// aged out meanwhile.
func (w *window) batch(ctx context.Context, want uint64) ([]jetstream.Msg, []uint64, error) {
	return w.batchUpTo(ctx, want, want)
}

// batchUpTo reads the newest messages still in the window, oldest first:
// at least want of them (unless fewer are left), at most most. A range
// wider than want costs fewer pending counts (see start) and more
// messages read: the newest are visited first, the rest are left unread
// for the next batch (the window only shrinks by what is visited).
func (w *window) batchUpTo(ctx context.Context, want, most uint64) ([]jetstream.Msg, []uint64, error) {
	want = min(want, w.left)
	if want == 0 {
		return nil, nil, nil
	}
	if w.left <= max(most, want) {
		// What is left fits: one consumer from lo, no search for where
		// the batch begins. Fewer read than counted: the rest aged out.
		msgs, seqs, err := w.read(ctx, w.lo, w.hi, w.left)
		if err == nil {
			w.left = uint64(len(msgs))
		}
		return msgs, seqs, err
	}
	start, n, err := w.start(ctx, w.lo, w.hi, w.above, want, max(most, want))
	if err != nil {
		return nil, nil, err
	}
	if start == w.lo {
		w.left = n // the search counted what is left
	}
	if n == 0 {
		return nil, nil, nil
	}
	return w.read(ctx, start, w.hi, n)
}

// walk visits the window's messages newest first while more holds, a
// batch at a time: size says how many the next batch reads — at least
// want (unless fewer are left), at most most (0: want) — and fn sees each
// message visited, with its sequence. It stops early when the messages
// aged out meanwhile.
func (w *window) walk(ctx context.Context, more func() bool, size func() (want, most uint64), fn func(msg jetstream.Msg, seq uint64) error) error {
	for w.left > 0 && more() {
		want, most := size()
		msgs, seqs, err := w.batchUpTo(ctx, want, most)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			return nil // aged out meanwhile
		}
		for i := len(msgs) - 1; i >= 0 && more(); i-- {
			w.visit(seqs[i])
			if err := fn(msgs[i], seqs[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// visit marks the message at seq visited: the window now ends below it.
func (w *window) visit(seq uint64) {
	w.hi, w.above = seq, w.above+1
	if w.left != uncounted {
		w.left -= min(w.left, 1)
	}
}

// next is the cursor of what is left, "" when nothing is.
func (w *window) next() string {
	if w.left == 0 {
		return ""
	}
	return formatCursor(w.hi)
}
