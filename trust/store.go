package trust

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	json "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
)

// ErrInvalid marks a call the store refuses: a task type that is not a valid
// key, or an outcome or gate call without an idempotency key.
var ErrInvalid = errors.New("trust: invalid input")

// Store keeps each task type's gate facts — its block streak, remembered
// gate decisions and canary places (Stats without Outcomes: the outcomes
// are on the outcome stream) — in a KV bucket, keyed by the type. Only the
// gate writes them, and only when a decision changes them (a block, a
// probe, a canary place taken or given up), never for a pass it simply
// admits. Every update is a compare-and-set on the key's revision, retried
// on conflict, so concurrent gates never lose an update; the updates of one
// process go through a kvcas.Writer, so a burst of them costs one write.
type Store struct {
	kv     jetstream.KeyValue
	policy Policy
	writer *kvcas.Writer[Stats]
}

// NewStore returns a store on kv that applies p (zero fields are defaults).
func NewStore(kv jetstream.KeyValue, p Policy) *Store {
	w := kvcas.NewWriter[Stats](kv)
	w.Clone = Stats.Clone
	return &Store{kv: kv, policy: p.WithDefaults(), writer: w}
}

// Get returns the gate facts of taskType (Outcomes nil), or Stats{Type:
// taskType} when there are none.
func (s *Store) Get(ctx context.Context, taskType string) (Stats, error) {
	st, _, err := s.get(ctx, taskType)
	return st, err
}

// Gate records the gate decision for the task identified by key (see
// Policy.Gate) and reports whether the task goes through as a probe and the
// block streak after the decision. A redelivered call with the same key gets
// the same answer. When below is false and the streak is already 0 nothing is
// written.
func (s *Store) Gate(ctx context.Context, taskType, key string, below bool) (probe bool, streak int, err error) {
	return s.GateUnder(ctx, s.policy, taskType, key, below)
}

// GateUnder is Gate under p, the policy of the task's type (its
// ProbeAfter), instead of the store's.
func (s *Store) GateUnder(ctx context.Context, p Policy, taskType, key string, below bool) (probe bool, streak int, err error) {
	p = p.WithDefaults()
	if key == "" {
		return false, 0, fmt.Errorf("%w: gate call without a key", ErrInvalid)
	}
	st, err := s.update(ctx, taskType, func(cur Stats) (Stats, bool) {
		next, pr, changed := p.Gate(cur, key, below)
		probe = pr
		return next, changed
	})
	if err != nil {
		return false, 0, err
	}
	return probe, st.BlockStreak, nil
}

// HeldProbe decides, under p, whether a held task of taskType goes through
// as a probe now (Policy.HeldProbe), and records the probe's time when it
// does. A look redelivered after it decided a probe finds the time taken
// and waits: a probe is delayed by a crash, never doubled.
// seen is the type's View.Stats: how many probes failed in a row.
func (s *Store) HeldProbe(ctx context.Context, p Policy, taskType string, now time.Time, seen Stats) (probe bool, err error) {
	return s.place(ctx, taskType, seen, func(cur Stats) (Stats, bool, bool) {
		next, probe := p.HeldProbe(cur, now)
		return next, probe, probe
	})
}

// Canary asks for a canary place for task key (its id) under p, the
// policy of its type (see Policy.AdmitCanary: a type may set its own number
// of canaries, or none), given the type's outcomes (seen: its View.Stats),
// and reports whether its pass may go.
func (s *Store) Canary(ctx context.Context, taskType, key string, now time.Time, p Policy, seen Stats) (admit bool, err error) {
	if key == "" {
		return false, fmt.Errorf("%w: canary call without a key", ErrInvalid)
	}
	return s.place(ctx, taskType, seen, func(cur Stats) (Stats, bool, bool) { return p.AdmitCanary(cur, key, now) })
}

// Rung asks for a place on rung for the retry of task key (its id) on its
// pass under p (Policy.AdmitRung), given the type's outcomes (seen: its
// View.Stats), and reports whether the retry may climb onto the rung now.
func (s *Store) Rung(ctx context.Context, taskType, key string, pass int, rung events.Rung, now time.Time, p Policy, seen Stats) (admit bool, err error) {
	if key == "" || rung == "" {
		return false, fmt.Errorf("%w: rung call without a key or a rung", ErrInvalid)
	}
	return s.place(ctx, taskType, seen, func(cur Stats) (Stats, bool, bool) { return p.AdmitRung(cur, key, pass, rung, now) })
}

// Trial asks for one of places trial places for task key (Policy.AdmitTrial):
// a held task re-admitted while its type is on probation.
func (s *Store) Trial(ctx context.Context, taskType, key string, now time.Time, p Policy, places int) (admit bool, err error) {
	if key == "" {
		return false, fmt.Errorf("%w: trial call without a key", ErrInvalid)
	}
	return s.place(ctx, taskType, Stats{}, func(cur Stats) (Stats, bool, bool) { return p.AdmitTrial(cur, key, now, places) })
}

// place takes a place in taskType's gate facts under compare-and-set:
// admit decides on the facts with the type's outcomes, folded once (seen:
// its View.Stats; none when admit reads none) and says whether the place
// was given and whether the facts changed.
func (s *Store) place(ctx context.Context, taskType string, seen Stats, admit func(Stats) (next Stats, ok, changed bool)) (ok bool, err error) {
	_, err = s.update(ctx, taskType, func(cur Stats) (Stats, bool) {
		cur.Outcomes, cur.Fold = seen.Outcomes, seen.Fold // the store keeps no outcomes
		next, a, changed := admit(cur)
		ok = a
		return next, changed
	})
	return ok, err
}

// Release gives up the canary place and the rung places of task key, if it
// holds any: the task ended, or the gate stopped it.
func (s *Store) Release(ctx context.Context, taskType, key string) (Stats, error) {
	return s.update(ctx, taskType, func(cur Stats) (Stats, bool) { return Release(cur, key) })
}

// ReleaseBefore gives up the rung places task key holds for passes before
// pass: the task went on without their outcomes.
func (s *Store) ReleaseBefore(ctx context.Context, taskType, key string, pass int) (Stats, error) {
	return s.update(ctx, taskType, func(cur Stats) (Stats, bool) { return ReleaseBefore(cur, key, pass) })
}

// Put writes st's gate facts unconditionally under st.Type (for
// rebuilding the bucket); its Outcomes are not stored.
func (s *Store) Put(ctx context.Context, st Stats) error {
	st.Outcomes = nil
	if !events.ValidType(st.Type) {
		return fmt.Errorf("%w: task type %q", ErrInvalid, st.Type)
	}
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("trust: encode %s: %w", st.Type, err)
	}
	if _, err := s.kv.Put(ctx, st.Type, data); err != nil {
		return fmt.Errorf("trust: put %s: %w", st.Type, err)
	}
	return nil
}

// All returns the gate facts of every task type in the bucket, sorted by
// type, read with a watch on js that takes only what its own consumer
// delivered (follow.WatchAll).
func (s *Store) All(ctx context.Context, js jetstream.JetStream) ([]Stats, error) {
	w, err := follow.WatchAll(ctx, js, s.kv, follow.WatchOptions{IgnoreDeletes: true})
	if err != nil {
		return nil, fmt.Errorf("trust: watch: %w", err)
	}
	defer w.Stop()
	byType := map[string]Stats{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("trust: watch stopped before the initial values")
			}
			if e == nil { // every current value has been delivered
				all := make([]Stats, 0, len(byType))
				for _, st := range byType {
					all = append(all, st)
				}
				slices.SortFunc(all, func(a, b Stats) int { return strings.Compare(a.Type, b.Type) })
				return all, nil
			}
			st, err := decode(e.Key(), e.Value())
			if err != nil {
				return nil, err
			}
			byType[e.Key()] = st
		}
	}
}

// update applies fn to the current stats of taskType under compare-and-set,
// retrying on conflict (kvcas.Writer). When fn reports no change nothing is
// written and the current stats are returned.
func (s *Store) update(ctx context.Context, taskType string, fn func(Stats) (Stats, bool)) (Stats, error) {
	if !events.ValidType(taskType) {
		return Stats{}, fmt.Errorf("%w: task type %q", ErrInvalid, taskType)
	}
	st, err := s.writer.Update(ctx, taskType, func(cur *Stats, _ bool) error {
		if cur.Type == "" {
			cur.Type = taskType
		}
		next, changed := fn(*cur)
		if !changed {
			return kvcas.ErrNoChange
		}
		*cur = next
		cur.Outcomes = nil // the outcomes live on the outcome stream
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("trust: %s: %w", taskType, err)
	}
	return st, nil
}

// get returns the stats of taskType and their revision (0 when absent).
func (s *Store) get(ctx context.Context, taskType string) (Stats, uint64, error) {
	if !events.ValidType(taskType) {
		return Stats{}, 0, fmt.Errorf("%w: task type %q", ErrInvalid, taskType)
	}
	e, err := s.kv.Get(ctx, taskType)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Stats{Type: taskType}, 0, nil
	}
	if err != nil {
		return Stats{}, 0, fmt.Errorf("trust: get %s: %w", taskType, err)
	}
	st, err := decode(taskType, e.Value())
	return st, e.Revision(), err
}

func decode(key string, data []byte) (Stats, error) {
	var st Stats
	if err := json.Unmarshal(data, &st); err != nil {
		return Stats{}, fmt.Errorf("trust: decode %s: %w", key, err)
	}
	if st.Type == "" {
		st.Type = key
	}
	return st, nil
}
