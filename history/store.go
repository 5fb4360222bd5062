package history

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/internal/directget"
)

// The history stream: every recorded attempt is one small message on
// dispatch.history.<type>.<key>.outcome, and a failure one more on
// ….failure, in the stream Stream, which keeps the newest Keep of each
// (its per-subject limit). A recorder publishes; nobody compare-and-sets a
// subject's record, so a subject many tasks work on is no hot key. A prompt
// reads a subject's last outcomes (what was tried) and last failures (is
// it failing again and again?) in one request.
const (
	// Stream holds the history (Limits retention, Keep per subject and kind).
	Stream = "DISPATCH_HISTORY"
	// Root prefixes the history subjects.
	Root = "dispatch.history"
	// Filter matches every history subject.
	Filter = Root + ".>"
	// EventEntry names a history message (the Dispatch-Event header).
	EventEntry = "history.entry.v1"
	// Keep is how many of a subject's last outcomes, and of its last
	// failures, the stream keeps: a prompt carries at most Keep previous
	// attempts, and a subject is found failing again and again from at most
	// Keep failures.
	Keep = 5
)

// Kinds of history subject: every outcome, and the failures among them.
const (
	KindOutcome = "outcome"
	KindFailure = "failure"
)

// ErrInvalid marks a call the history refuses: a task type that is not
// valid, or an entry without an idempotency key.
var ErrInvalid = errors.New("history: invalid input")

// Key names the history of (taskType, subject): the type, a dot and the
// first 32 hex digits of the SHA-256 of the subject (subjects are file
// paths, URLs…, not subject tokens).
func Key(taskType, subject string) string {
	sum := sha256.Sum256([]byte(subject))
	return taskType + "." + hex.EncodeToString(sum[:16])
}

// Subject is the stream subject of (taskType, subject)'s entries of kind.
func Subject(taskType, subject, kind string) string {
	return Root + "." + Key(taskType, subject) + "." + kind
}

// Message is one history message: an entry with the (type, subject) it
// belongs to, so a reader of the stream needs no hash to tell.
type Message struct {
	Type    string `json:"type"`
	Subject string `json:"subject"`
	Entry
}

// Msgs are the messages that record e for (taskType, subject): one on the
// outcome subject, and for a failure one on the failure subject. Each
// carries e.Key in its Nats-Msg-Id, so a redelivered outcome is stored once.
func Msgs(taskType, subject string, e Entry) ([]*nats.Msg, error) {
	if !events.ValidType(taskType) {
		return nil, fmt.Errorf("%w: task type %q", ErrInvalid, taskType)
	}
	if e.Key == "" {
		return nil, fmt.Errorf("%w: entry without a key", ErrInvalid)
	}
	data, err := json.Marshal(Message{Type: taskType, Subject: subject, Entry: e})
	if err != nil {
		return nil, fmt.Errorf("history: encode %s: %w", e.Key, err)
	}
	kinds := []string{KindOutcome}
	if e.Outcome == events.OutcomeFailure {
		kinds = append(kinds, KindFailure)
	}
	msgs := make([]*nats.Msg, len(kinds))
	for i, kind := range kinds {
		m := nats.NewMsg(Subject(taskType, subject, kind))
		m.Header.Set(nats.MsgIdHdr, e.Key+":"+kind)
		m.Header.Set(events.HeaderEvent, EventEntry)
		m.Data = data
		msgs[i] = m
	}
	return msgs, nil
}

// Record is what the stream keeps of one (type, subject): its last
// outcomes and its last failures, each oldest first, at most Keep each.
type Record struct {
	Type     string  `json:"type"`
	Subject  string  `json:"subject"`
	Outcomes []Entry `json:"outcomes,omitempty"`
	Failures []Entry `json:"failures,omitempty"`
}

// Add returns r with e recorded (Insert, keeping Keep of each kind); changed
// is false when e was already there. r is not modified.
func (r Record) Add(e Entry) (next Record, changed bool) {
	next = r
	next.Outcomes, changed = Insert(r.Outcomes, e, Keep)
	if e.Outcome == events.OutcomeFailure {
		var f bool
		next.Failures, f = Insert(r.Failures, e, Keep)
		changed = changed || f
	}
	return next, changed
}

// Log reads the history stream; the recorder writes it (Msgs) through its
// router, so a recorded outcome and the task's next step are published the
// same way.
type Log struct {
	get *directget.Getter
}

// NewLog returns a Log reading with direct gets on nc.
func NewLog(nc *nats.Conn) *Log { return &Log{get: directget.New(nc)} }

// Close releases the Log's subscription.
func (l *Log) Close() error { return l.get.Close() }

// Outcomes returns the last outcomes of (taskType, subject), oldest first:
// one direct get of one subject, answered with at most Keep small messages.
func (l *Log) Outcomes(ctx context.Context, taskType, subject string) ([]Entry, error) {
	return l.read(ctx, taskType, subject, KindOutcome)
}

// Failures returns the last failures of (taskType, subject), oldest first.
func (l *Log) Failures(ctx context.Context, taskType, subject string) ([]Entry, error) {
	return l.read(ctx, taskType, subject, KindFailure)
}

// Recent returns both, the Record the stream keeps of (taskType, subject).
func (l *Log) Recent(ctx context.Context, taskType, subject string) (Record, error) {
	rec := Record{Type: taskType, Subject: subject}
	var err error
	if rec.Outcomes, err = l.Outcomes(ctx, taskType, subject); err != nil {
		return rec, err
	}
	rec.Failures, err = l.Failures(ctx, taskType, subject)
	return rec, err
}

// read reads one subject. The subject is literal, never a wildcard: the
// server finds a literal subject's messages through its per-subject index,
// where a wildcard makes it scan the messages in between.
func (l *Log) read(ctx context.Context, taskType, subject, kind string) ([]Entry, error) {
	if !events.ValidType(taskType) {
		return nil, fmt.Errorf("%w: task type %q", ErrInvalid, taskType)
	}
	msgs, err := l.get.Subject(ctx, Stream, Subject(taskType, subject, kind), Keep)
	if err != nil {
		return nil, fmt.Errorf("history: %s %q: %w", taskType, subject, err)
	}
	var entries []Entry
	for _, m := range msgs {
		var hm Message
		if err := json.Unmarshal(m.Data, &hm); err != nil || hm.Key == "" {
			continue // not a recorder's message: nothing to learn from it
		}
		entries, _ = Insert(entries, hm.Entry, Keep)
	}
	return entries, nil
}

// RecentFailures counts the failures of (type, subject) at or after since
// from its last outcomes alone, and reports whether that count is the
// whole answer: when fewer than Keep outcomes are kept (none was dropped),
// or the oldest kept is older than since (every dropped one is too).
// Otherwise only its failures (Log.Failures) tell.
func RecentFailures(outcomes []Entry, since time.Time) (n int, sure bool) {
	n = Failures(outcomes, since)
	return n, len(outcomes) < Keep || outcomes[0].At.Before(since)
}

// ReadAll reads the whole history stream (dispatch rebuild, the fault
// suite's checker): every (type, subject)'s Record, by Key. It is bounded
// by the subjects worked on, not by the tasks: Keep of each kind apiece.
func ReadAll(ctx context.Context, js jetstream.JetStream) (map[string]*Record, error) {
	stream, err := js.Stream(ctx, Stream)
	if err != nil {
		return nil, fmt.Errorf("history: stream %s: %w", Stream, err)
	}
	all := map[string]*Record{}
	last := stream.CachedInfo().State.LastSeq
	if stream.CachedInfo().State.Msgs == 0 {
		return all, nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{Filter}})
	if err != nil {
		return nil, fmt.Errorf("history: read %s: %w", Stream, err)
	}
	for {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("history: read %s: %w", Stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			var hm Message
			if err := json.Unmarshal(m.Data(), &hm); err != nil || hm.Key == "" {
				return nil, fmt.Errorf("history: %s seq %d does not decode: %v", m.Subject(), meta.Sequence.Stream, err)
			}
			k := Key(hm.Type, hm.Subject)
			rec := all[k]
			if rec == nil {
				rec = &Record{Type: hm.Type, Subject: hm.Subject}
				all[k] = rec
			}
			if strings.HasSuffix(m.Subject(), "."+KindFailure) {
				rec.Failures, _ = Insert(rec.Failures, hm.Entry, Keep)
			} else {
				rec.Outcomes, _ = Insert(rec.Outcomes, hm.Entry, Keep)
			}
			if meta.Sequence.Stream >= last || meta.NumPending == 0 {
				return all, nil
			}
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("history: read %s: %w", Stream, err)
		}
		if n == 0 {
			return all, nil
		}
	}
}

// Failures counts the failures among entries at or after since.
func Failures(entries []Entry, since time.Time) int {
	n := 0
	for _, e := range entries {
		if e.Outcome == events.OutcomeFailure && !e.At.Before(since) {
			n++
		}
	}
	return n
}

func lastN[T any](s []T, n int) []T {
	if n >= 0 && len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Insert adds e to entries (oldest first) in (At, Key) order, keeping the
// newest limit. It is idempotent: an entry whose Key is present, or one
// older than every entry of a full history, changes nothing. The order does
// not depend on arrival, so replaying the same entries in any order
// (dispatch rebuild) gives the same history.
func Insert(entries []Entry, e Entry, limit int) ([]Entry, bool) {
	if slices.ContainsFunc(entries, func(x Entry) bool { return x.Key == e.Key }) {
		return entries, false
	}
	i := len(entries)
	for i > 0 && later(entries[i-1], e) {
		i--
	}
	if limit > 0 && len(entries) >= limit && i == 0 {
		return entries, false
	}
	out := slices.Insert(slices.Clone(entries), i, e)
	return lastN(out, limit), true
}

func later(a, b Entry) bool {
	if !a.At.Equal(b.At) {
		return a.At.After(b.At)
	}
	return a.Key > b.Key
}
