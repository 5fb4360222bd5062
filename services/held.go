package services

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	json "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// HeldEntry is one pass the gate holds back, asleep in the held index
// (bucket dispatch_held) until the gate wakes it. A pass held for its
// type's trust is woken when its type recovered, a probe of it is due, or
// its hold time ran out; one waiting for its type's canaries when a
// canary place is free, the canaries' results scored the type, or it
// waited the canary TTL. A held pass sleeps here, not in a consumer's
// pending messages, so however many are held none takes a slot another
// type's pass needs.
type HeldEntry struct {
	Task string `json:"task"`
	Type string `json:"type"`
	Pass int    `json:"pass"`
	// Retry: the pass is a retry (its type's trust is judged on settled
	// tasks only, as the gate judges a retry).
	Retry bool `json:"retry,omitempty"`
	// Since is when the gate first held the pass (the held event's time):
	// the index is ordered by it within a type, oldest first.
	Since time.Time `json:"since"`
	// Seq is the stream sequence of a held event of the pass on Stream:
	// a wake republishes it.
	Seq uint64 `json:"seq"`
	// Reason is the gate's, as the task's state shows it.
	Reason string `json:"reason,omitempty"`
	// Hold is what the pass waits for: its type's trust (written "", read
	// as events.HoldTrust too), its type's canaries (events.HoldCanary),
	// a place on a rung (events.HoldRung) or its turn (events.HoldQueued).
	Hold events.Hold `json:"hold,omitempty"`
	// Rung is the rung a retry waits to climb onto (events.HoldRung).
	Rung events.Rung `json:"rung,omitempty"`
}

// HeldEntryOf is the entry of the pass ev holds, asleep for hold (its
// type's trust is written "") from the message at stream sequence seq;
// rung is the rung a retry waiting for one (events.HoldRung) waits to
// climb onto.
func HeldEntryOf(ev events.Held, seq uint64, hold events.Hold, rung events.Rung) HeldEntry {
	e := HeldEntry{Task: ev.Task.ID, Type: ev.Task.Type, Pass: ev.Run.Pass, Retry: ev.Run.Attempt > 1,
		Since: ev.At, Seq: seq, Reason: ev.Reason}
	switch hold {
	case events.HoldTrust:
	case events.HoldRung:
		e.Hold, e.Rung = hold, rung
	default:
		e.Hold = hold
	}
	return e
}

// Canary reports whether the pass waits for its type's canaries.
func (e HeldEntry) Canary() bool { return e.Hold == events.HoldCanary }

// ForTrust reports whether the pass is held for its type's trust (status
// held), not waiting for its canaries or its turn (status unchanged).
func (e HeldEntry) ForTrust() bool { return e.Hold == "" || e.Hold == events.HoldTrust }

// Key is the entry's key: <type>.<since, ns, 19 digits>.<task id>.<pass>.
// Types and task ids hold no dot, so a type's keys are <type>.> and sort
// oldest first.
func (e HeldEntry) Key() string {
	return HeldKey(e.Type, e.Since, e.Task, e.Pass)
}

// HeldKey is the held index key of a pass of task id of taskType held
// since since.
func HeldKey(taskType string, since time.Time, id string, pass int) string {
	return fmt.Sprintf("%s.%019d.%s.%d", taskType, since.UnixNano(), id, pass)
}

// ParseHeldKey reads a held index key back; ok is false for any other key.
func ParseHeldKey(key string) (taskType string, since time.Time, id string, pass int, ok bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 4 || !events.ValidType(parts[0]) || !events.ValidID(parts[2]) {
		return "", time.Time{}, "", 0, false
	}
	ns, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || len(parts[1]) != 19 {
		return "", time.Time{}, "", 0, false
	}
	if pass, err = strconv.Atoi(parts[3]); err != nil || pass < 1 {
		return "", time.Time{}, "", 0, false
	}
	return parts[0], time.Unix(0, ns).UTC(), parts[2], pass, true
}

// HeldIndex is the held index: the passes the gate holds back (for trust
// or waiting for canaries), by type, oldest first. The gate's held consumer writes it (an entry when a
// look leaves a pass asleep, removed when a look ends the hold); the
// gate's sweeper watches it and wakes entries; the review tools list it.
type HeldIndex struct{ kv jetstream.KeyValue }

// NewHeldIndex wraps the held bucket.
func NewHeldIndex(kv jetstream.KeyValue) *HeldIndex { return &HeldIndex{kv: kv} }

// KV is the bucket.
func (h *HeldIndex) KV() jetstream.KeyValue { return h.kv }

// Put adds e unless its key is there already (a redelivered look): the
// first entry of a pass stays, with the sequence it names.
func (h *HeldIndex) Put(ctx context.Context, e HeldEntry) error {
	if !events.ValidType(e.Type) || !events.ValidID(e.Task) || e.Pass < 1 || e.Seq == 0 {
		return fmt.Errorf("held index: invalid entry %+v", e)
	}
	data, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("held index: encode %s: %w", e.Key(), err)
	}
	if _, err := h.kv.Create(ctx, e.Key(), data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("held index: put %s: %w", e.Key(), err)
	}
	return nil
}

// Delete removes the entry under key; one already gone is no error. It
// purges the key with a marker that expires after HeldMarkerTTL, so the
// bucket holds only the live entries, not a marker for every pass ever
// held (a watcher sees the purge as it is stored).
func (h *HeldIndex) Delete(ctx context.Context, key string) error {
	if err := h.kv.Purge(ctx, key, jetstream.PurgeTTL(HeldMarkerTTL)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("held index: delete %s: %w", key, err)
	}
	return nil
}

// HeldMarkerTTL is how long the held bucket keeps the marker of a removed
// entry (its LimitMarkerTTL, and each purge's).
// An hour: far longer than a watcher lags or reconnects, so the
// sweeper's copy of the index sees every removal.
const HeldMarkerTTL = time.Hour

// DecodeHeldEntry decodes an entry's value, checking it against its key.
func DecodeHeldEntry(key string, data []byte) (HeldEntry, error) {
	var e HeldEntry
	if err := json.Unmarshal(data, &e); err != nil {
		return e, fmt.Errorf("held index: %s: %w", key, err)
	}
	if e.Key() != key {
		return e, fmt.Errorf("held index: %s holds the entry of %s", key, e.Key())
	}
	return e, nil
}
