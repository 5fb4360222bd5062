package history

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/internal/kvcas"
)

// DefaultLimit is the number of entries kept per (type, subject) when
// NewStore is given no limit.
const DefaultLimit = 50

// ErrInvalid marks a call the store refuses: a task type that is not valid,
// or an entry without an idempotency key.
var ErrInvalid = errors.New("history: invalid input")

// Record is the value stored under Key(Type, Subject). It carries the type
// and subject so tools can list what the bucket holds without the hash.
type Record struct {
	Type    string `json:"type"`
	Subject string `json:"subject"`
	// Entries are ordered by At, oldest first.
	Entries []Entry `json:"entries"`
}

// Clone returns a copy of r that shares no slice with it.
func (r Record) Clone() Record {
	r.Entries = slices.Clone(r.Entries)
	return r
}

// Key is the KV key of (taskType, subject): the type, a dot and the first 32
// hex digits of the SHA-256 of the subject (subjects are file paths, URLs…,
// not valid keys).
func Key(taskType, subject string) string {
	sum := sha256.Sum256([]byte(subject))
	return taskType + "." + hex.EncodeToString(sum[:16])
}

// Store keeps the recent entries of each (type, subject) in a KV bucket.
// Appends of one process go through a kvcas.Writer: those to one subject
// that arrive together are written together.
type Store struct {
	kv     jetstream.KeyValue
	limit  int
	writer *kvcas.Writer[Record]
}

// NewStore returns a store on kv keeping at most limit entries per
// (type, subject); limit <= 0 means DefaultLimit.
func NewStore(kv jetstream.KeyValue, limit int) *Store {
	if limit <= 0 {
		limit = DefaultLimit
	}
	w := kvcas.NewWriter[Record](kv)
	w.Clone = Record.Clone
	return &Store{kv: kv, limit: limit, writer: w}
}

// Append adds e to the history of (taskType, subject), in At order, dropping
// the oldest entries beyond the limit. It is a compare-and-set retried on
// conflict (kvcas.Writer), and idempotent: an entry whose Key is already kept changes nothing.
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
		entries, changed := Insert(rec.Entries, e, s.limit)
		if !changed {
			return kvcas.ErrNoChange
		}
		rec.Entries = entries
		return nil
	})
	if err != nil {
		return fmt.Errorf("history: %s: %w", key, err)
	}
	return nil
}

// Recent returns the last n entries of (taskType, subject), oldest first; all
// kept entries when n <= 0, none when there is no history.
func (s *Store) Recent(ctx context.Context, taskType, subject string, n int) ([]Entry, error) {
	key, err := validKey(taskType, subject)
	if err != nil {
		return nil, err
	}
	rec, _, err := s.get(ctx, key, taskType, subject)
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return rec.Entries, nil
	}
	return lastN(rec.Entries, n), nil
}

// FailuresSince counts the kept failures of (taskType, subject) at or after
// since (recurring-error detection, SPEC §8).
func (s *Store) FailuresSince(ctx context.Context, taskType, subject string, since time.Time) (int, error) {
	entries, err := s.Recent(ctx, taskType, subject, 0)
	if err != nil {
		return 0, err
	}
	return Failures(entries, since), nil
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

// Put writes the history of (taskType, subject) unconditionally (for
// rebuilding the bucket): entries as given, oldest first, the newest limit kept.
func (s *Store) Put(ctx context.Context, taskType, subject string, entries []Entry) error {
	key, err := validKey(taskType, subject)
	if err != nil {
		return err
	}
	rec := Record{Type: taskType, Subject: subject, Entries: lastN(entries, s.limit)}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("history: encode %s: %w", key, err)
	}
	if _, err := s.kv.Put(ctx, key, data); err != nil {
		return fmt.Errorf("history: put %s: %w", key, err)
	}
	return nil
}

// get returns the record under key and its revision (0 when absent).
func (s *Store) get(ctx context.Context, key, taskType, subject string) (Record, uint64, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{Type: taskType, Subject: subject}, 0, nil
	}
	if err != nil {
		return Record{}, 0, fmt.Errorf("history: get %s: %w", key, err)
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return Record{}, 0, fmt.Errorf("history: decode %s: %w", key, err)
	}
	rec.Type, rec.Subject = taskType, subject
	return rec, e.Revision(), nil
}

func validKey(taskType, subject string) (string, error) {
	if !events.ValidType(taskType) {
		return "", fmt.Errorf("%w: task type %q", ErrInvalid, taskType)
	}
	return Key(taskType, subject), nil
}

func lastN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Insert adds e to entries (oldest first) in (At, Key) order, keeping the
// newest limit. It is idempotent: an entry whose Key is present changes
// nothing. The order does not depend on arrival, so replaying the same
// entries in any order (dispatch rebuild) gives the same history.
func Insert(entries []Entry, e Entry, limit int) ([]Entry, bool) {
	if slices.ContainsFunc(entries, func(x Entry) bool { return x.Key == e.Key }) {
		return entries, false
	}
	i := len(entries)
	for i > 0 && later(entries[i-1], e) {
		i--
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
