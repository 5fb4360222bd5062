package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Apply overwrites the live stores with the rebuilt ones: every task
// state; the gate facts of the types whose facts differ (their canary
// places kept, compare-and-set against the gate); the history records
// that differ (history.Store.Put; one no event implies is deleted); the
// outcomes of each type that differ — their subject purged and the
// rebuilt messages published again, oldest first; the spend counters
// corrected to the rebuilt totals; the held index's entries that differ
// (one missing written, one no event implies deleted). Applied again, it
// finds nothing more to rewrite in the history bucket, the held index or
// on the outcome stream.
//
// A service that follows the outcome stream (the gate's trust.View) does
// not see a purge: run Apply with the mesh stopped, or restart it after.
func Apply(ctx context.Context, live Live, rebuilt *Stores) error {
	cur, err := readLive(ctx, Live{Trust: live.Trust, History: live.History, Held: live.Held, JS: live.JS, Spending: live.Spending})
	if err != nil {
		return err
	}
	rebuilt.keepBeforeHorizon(cur)
	rebuilt.keepAfterReplay(cur)
	rebuilt.keepCommitOrder(cur)
	if live.Tasks != nil {
		for _, k := range slices.Sorted(maps.Keys(rebuilt.Tasks)) {
			if err := applyTask(ctx, live.Tasks, k, *rebuilt.Tasks[k], rebuilt.Horizon); err != nil {
				return err
			}
		}
	}
	if live.Trust != nil {
		if err := applyGateFacts(ctx, live.Trust, cur.facts, rebuilt.Trust); err != nil {
			return err
		}
	}
	if live.History != nil {
		if err := applyHistory(ctx, live.History, cur.history, rebuilt.History); err != nil {
			return err
		}
	}
	if live.Held != nil {
		if err := applyHeld(ctx, live.Held, cur.held, rebuilt.Held); err != nil {
			return err
		}
	}
	if live.JS != nil {
		// Purged messages keep their Msg-Id in the stream's deduplication
		// window: published again under it, they would be dropped as
		// duplicates. The rebuilt ones carry it salted, once per Apply.
		salt := "rebuilt-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		if err := applyOutcomes(ctx, live.JS, cur.outcomes, rebuilt.Trust, salt); err != nil {
			return err
		}
	}
	if live.Spending == nil {
		return nil
	}
	for k := range cur.spend {
		if _, ok := rebuilt.Spend[k]; !ok {
			rebuilt.Spend[k] = trust.DaySpend{Type: k[0], Day: k[1]}
		}
	}
	for k, want := range rebuilt.Spend {
		if err := live.Spending.CorrectTo(ctx, cur.spend[k], want); err != nil {
			return err
		}
	}
	return nil
}

// applyGateFacts writes the rebuilt block streak and gate decisions of
// each type whose facts differ, keeping the canary places the gate holds.
func applyGateFacts(ctx context.Context, kv jetstream.KeyValue, have, rebuilt map[string]*trust.Stats) error {
	for _, k := range slices.Sorted(maps.Keys(union(have, rebuilt))) {
		if entryDiffs(events.BucketTrust, k, have[k], rebuilt[k], gateFacts, noGateFacts) == nil {
			continue
		}
		var want trust.Stats
		if b := rebuilt[k]; b != nil {
			want = gateFacts(*b)
		}
		_, err := kvcas.Update(ctx, kv, k, func(st *trust.Stats, _ bool) error {
			st.Type, st.BlockStreak, st.Gates, st.Outcomes = k, want.BlockStreak, want.Gates, nil
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s %s: %w", events.BucketTrust, k, err)
		}
	}
	return nil
}

// applyOutcomes rewrites the outcome subject of each type whose outcomes differ.
func applyOutcomes(ctx context.Context, js jetstream.JetStream, have, rebuilt map[string]*trust.Stats, salt string) error {
	for _, typ := range slices.Sorted(maps.Keys(union(have, rebuilt))) {
		if entryDiffs(StoreOutcomes, typ, have[typ], rebuilt[typ], newestOutcomes, noOutcomes) == nil {
			continue
		}
		var msgs []*nats.Msg
		if b := rebuilt[typ]; b != nil {
			for _, o := range lastN(b.Outcomes, trust.Keep) {
				m, err := trust.OutcomeMsg(typ, o)
				if err != nil {
					return err
				}
				msgs = append(msgs, m)
			}
		}
		if err := rewrite(ctx, js, trust.OutcomeStream, trust.OutcomeSubject(typ), msgs, salt); err != nil {
			return err
		}
	}
	return nil
}

// applyHistory writes the rebuilt record of each (type, subject) whose
// record in the history bucket differs, and deletes the records no event
// implies.
func applyHistory(ctx context.Context, kv jetstream.KeyValue, have map[string]*json.RawMessage, rebuilt map[string]*history.Record) error {
	store := history.NewStore(kv)
	want := asStored(rebuilt)
	for _, k := range slices.Sorted(maps.Keys(union(have, want))) {
		if entryDiffs(events.BucketHistory, k, have[k], want[k], same[json.RawMessage], nil) == nil {
			continue
		}
		var err error
		if rec := rebuilt[k]; rec != nil {
			err = store.Put(ctx, *rec)
		} else if err = kv.Delete(ctx, k); errors.Is(err, jetstream.ErrKeyNotFound) {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", events.BucketHistory, k, err)
		}
	}
	return nil
}

// applyHeld writes the rebuilt held entries missing from the held index or
// differing there, and deletes the entries no event implies. A pass
// written back sleeps until the gate's sweeper wakes it, as if its look
// had put it there.
func applyHeld(ctx context.Context, kv jetstream.KeyValue, have map[string]*json.RawMessage, rebuilt map[string]*services.HeldEntry) error {
	want := heldAsStored(rebuilt)
	for _, k := range slices.Sorted(maps.Keys(union(have, want))) {
		if entryDiffs(events.BucketHeld, k, have[k], want[k], same[json.RawMessage], nil) == nil {
			continue
		}
		var err error
		if raw := want[k]; raw != nil {
			_, err = kv.Put(ctx, k, *raw)
		} else {
			err = services.NewHeldIndex(kv).Delete(ctx, k)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", events.BucketHeld, k, err)
		}
	}
	return nil
}

// rewrite purges subject from stream and publishes msgs on it in order,
// each under its Msg-Id salted with salt.
func rewrite(ctx context.Context, js jetstream.JetStream, stream, subject string, msgs []*nats.Msg, salt string) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return fmt.Errorf("purge %s: %w", subject, err)
	}
	for _, m := range msgs {
		m.Header.Set(nats.MsgIdHdr, m.Header.Get(nats.MsgIdHdr)+":"+salt)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return fmt.Errorf("publish %s: %w", subject, err)
		}
	}
	return nil
}

// applyTask writes the rebuilt state of task k where it differs from the
// live one in what events decide (normTask), under compare-and-set: what
// only the executor keeps — its transient count, unbilled spend, tool loop
// to resume, banned tool calls, the submission's sequence — is the live
// state's, which the events cannot say; a task whose state holds nothing
// else different is not written at all.
func applyTask(ctx context.Context, kv jetstream.KeyValue, k string, built events.TaskState, horizon time.Time) error {
	_, err := kvcas.Update(ctx, kv, k, func(st *events.TaskState, found bool) error {
		if found && len(entryDiffs(events.BucketTasks, k, st, &built, normTask, nil)) == 0 {
			return kvcas.ErrNoChange
		}
		if found && st.CreatedAt.Before(horizon) || built.CreatedAt.Before(horizon) {
			return kvcas.ErrNoChange // its first events are gone: the replay knows only its end
		}
		next := built
		if found {
			next.SubmitSeq, next.TransientRetries, next.Unbilled, next.Resume = st.SubmitSeq, st.TransientRetries, st.Unbilled, st.Resume
			for _, e := range st.FailedRequests {
				if strings.HasPrefix(e, "tool:") && !slices.Contains(next.FailedRequests, e) {
					next.FailedRequests = append(slices.Clone(next.FailedRequests), e)
				}
			}
		}
		*st = next
		return nil
	})
	return err
}
