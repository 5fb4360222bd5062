package history

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	json "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
)

// Keep is how many of a (type, subject)'s last outcomes, and apart of its
// last failures, the history keeps: a prompt carries at most Keep previous
// attempts, and a subject is found failing again and again from at most
// Keep failures. A record stays small (at most 2 × Keep entries, each
// capped: Entry.Capped), so the prompt builder reads it, and a recorder
// rewrites it, cheaply.
const Keep = policy.HistoryKeep

// Caps on the text of an Entry, in bytes: a prompt shows a line of an
// entry (prompt.maxLineChars: 200 characters), a human a few lines. The
// approach is kept as the executor caps an answer's, whole, so an answer
// repeating it is still recognised as a dead end. A record holds at most
// 2 × Keep × 6 KiB of text.
const (
	MaxApproach = events.MaxApproach
	MaxSummary  = 2 << 10
	MaxError    = 2 << 10
)

// ErrInvalid marks a call the store refuses: a task type that is not valid,
// or an entry without an idempotency key.
var ErrInvalid = errors.New("history: invalid input")

// Record is the value stored under Key(Type, Subject): the subject's last
// outcomes and, apart, its last failures, each oldest first, at most Keep
// each. It carries the type and subject so tools can list what the bucket
// holds without the hash.
type Record struct {
	Type     string  `json:"type"`
	Subject  string  `json:"subject"`
	Outcomes []Entry `json:"outcomes,omitempty"`
	Failures []Entry `json:"failures,omitempty"`
}

// Add returns r with e recorded (Insert, keeping Keep of each kind, the
// oldest dropped first), its text capped (Entry.Capped); changed is false
// when e was already there. r is not modified.
func (r Record) Add(e Entry) (next Record, changed bool) {
	e = e.Capped()
	next = r
	next.Outcomes, changed = Insert(r.Outcomes, e, Keep)
	if e.Outcome == events.OutcomeFailure {
		var f bool
		next.Failures, f = Insert(r.Failures, e, Keep)
		changed = changed || f
	}
	return next, changed
}

// Clone returns a copy of r that shares no slice with it.
func (r Record) Clone() Record {
	r.Outcomes, r.Failures = slices.Clone(r.Outcomes), slices.Clone(r.Failures)
	return r
}

// Key is the KV key of (taskType, subject): the type, a dot and the first 32
// hex digits of the SHA-256 of the subject (subjects are file paths, URLs…,
// not valid keys).
func Key(taskType, subject string) string {
	sum := sha256.Sum256([]byte(subject))
	return taskType + "." + hex.EncodeToString(sum[:16])
}

// Store keeps each (type, subject)'s Record in a KV bucket. An append is a
// compare-and-set retried on conflict, so concurrent recorders lose
// nothing; the appends of one process go through a kvcas.Writer, so those
// to one subject that arrive together are written together and a subject
// the process wrote last needs no read. The key is a subject's, not a
// type's: recorders contend only when they record attempts on the same
// subject at once.
type Store struct {
	kv     jetstream.KeyValue
	writer *kvcas.Writer[Record]
}

// NewStore returns a store on kv.
func NewStore(kv jetstream.KeyValue) *Store {
	w := kvcas.NewWriter[Record](kv)
	w.Clone = Record.Clone
	return &Store{kv: kv, writer: w}
}

// Append records e in the history of (taskType, subject) (Record.Add). It
// is idempotent: an entry whose Key is already kept changes nothing.
func (s *Store) Append(ctx context.Context, taskType, subject string, e Entry) error {
	if e.Key == "" {
		return fmt.Errorf("%w: entry without a key", ErrInvalid)
	}
	key, err := validKey(taskType, subject)
	if err != nil {
		return err
	}
	_, err = s.writer.Update(ctx, key, func(rec *Record, _ bool) error {
		rec.Type, rec.Subject = taskType, subject
		next, changed := rec.Add(e)
		if !changed {
			return kvcas.ErrNoChange
		}
		*rec = next
		return nil
	})
	if err != nil {
		return fmt.Errorf("history: %s: %w", key, err)
	}
	return nil
}

// Recent returns the Record of (taskType, subject) — one read — or an empty
// one when there is no history.
func (s *Store) Recent(ctx context.Context, taskType, subject string) (Record, error) {
	key, err := validKey(taskType, subject)
	if err != nil {
		return Record{}, err
	}
	rec, _, found, err := kvcas.Get[Record](ctx, s.kv, key)
	if err != nil {
		return Record{}, fmt.Errorf("history: %w", err)
	}
	if !found {
		rec = Record{}
	}
	rec.Type, rec.Subject = taskType, subject
	return rec, nil
}

// Put writes the Record of (taskType, subject) unconditionally (for
// rebuilding the bucket).
func (s *Store) Put(ctx context.Context, rec Record) error {
	key, err := validKey(rec.Type, rec.Subject)
	if err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("history: encode %s: %w", key, err)
	}
	if _, err := s.kv.Put(ctx, key, data); err != nil {
		return fmt.Errorf("history: put %s: %w", key, err)
	}
	return nil
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

// DeadEnds are the failures among entries at or after since that name
// their approach, oldest first, as dead ends of an earlier task (attempt
// 0): a task that starts on PIVOT because its subject keeps failing is
// shown them, and must not repeat them.
func DeadEnds(entries []Entry, since time.Time) []events.DeadEnd {
	var ends []events.DeadEnd
	for _, e := range entries {
		if e.Outcome == events.OutcomeFailure && !e.At.Before(since) && strings.TrimSpace(e.Approach) != "" {
			ends = append(ends, events.DeadEnd{Approach: e.Approach, Reason: e.Error, Rung: e.Rung})
		}
	}
	return ends
}

func validKey(taskType, subject string) (string, error) {
	if !events.ValidType(taskType) {
		return "", fmt.Errorf("%w: task type %q", ErrInvalid, taskType)
	}
	return Key(taskType, subject), nil
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
