package services

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// DeadLetters decides what becomes of a message whose handler failed and
// returns it as a *Fate for the router to carry out:
//
//	Snooze(d)             nak with delay d (counted snoozed)
//	Snooze on the last    poison: still snoozed after MaxDeliver deliveries
//	Dead(reason, err)     dead-letter under reason, terminate
//	shutdown              nak at once: the next instance takes it
//	last delivery         poison: failed MaxDeliver deliveries
//	any other error       nak with Backoff(delivered) (counted retried)
//
// A message to terminate is first copied to dispatch.review.<reason> with
// publish (see DeadLetter); if that fails it is nak'ed with the backoff
// instead, uncounted, so it is never dropped. Shutdown is ctx being done:
// the router's context, outside any handler deadline. A failure to publish
// the handler's outputs is retried even at shutdown. spec's zero fields
// take their defaults.
func DeadLetters(spec Spec, publish func(context.Context, Out) error) Middleware {
	spec = spec.withDefaults()
	return func(next Handler) Handler {
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			outs, err := next(ctx, m)
			if err == nil {
				return outs, nil
			}
			f, key, cause := decide(spec, m, err, ctx.Err() != nil)
			if f.Action != ActionTerm {
				return nil, f
			}
			// A shutdown must not cut the copy short: a fresh deadline.
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
			defer cancel()
			if perr := publish(pctx, DeadLetter(m, spec.Stream, f.Reason, key, cause)); perr != nil {
				return nil, &Fate{
					Action: ActionNak, Delay: spec.Backoff(m.Delivered), Result: ResultNone,
					Err: fmt.Errorf("dead-letter to review %s failed: %w; cause: %w", f.Reason, perr, f.Err),
				}
			}
			return nil, f
		}
	}
}

// decide is the fate of a message whose handler returned err and, when
// it is terminated, the key and cause of its review record.
func decide(spec Spec, m *Msg, err error, shutdown bool) (f *Fate, key string, cause error) {
	var dead *DeadError
	var pub *publishError
	switch delay, snoozed := IsSnooze(err); {
	case snoozed && m.Delivered >= spec.MaxDeliver:
		// The server would not deliver it again: keep it for a human.
		return poison(fmt.Errorf("still snoozed after %d deliveries: %w", m.Delivered, err))
	case snoozed:
		return &Fate{Action: ActionNak, Delay: delay, Result: ResultSnoozed, Err: err}, "", nil
	case errors.As(err, &dead):
		return &Fate{Action: ActionTerm, Reason: dead.Reason, Result: ResultDead, Err: err}, dead.Key, dead.Err
	case shutdown && !errors.As(err, &pub):
		return &Fate{Action: ActionNak, Result: ResultShutdown, Err: err}, "", nil
	case m.Delivered >= spec.MaxDeliver:
		return poison(fmt.Errorf("failed %d deliveries, last error: %w", m.Delivered, err))
	default:
		return &Fate{Action: ActionNak, Delay: spec.Backoff(m.Delivered), Result: ResultRetried, Err: err}, "", nil
	}
}

func poison(cause error) (*Fate, string, error) {
	return &Fate{Action: ActionTerm, Reason: events.ReviewPoison, Result: ResultDead, Err: cause}, "", cause
}

// DeadLetter builds the review record of a message that cannot be handled:
// the original bytes, the Dispatch-* headers of the original, and the reason.
// The record is filed under key, else under the task the message belongs
// to (TaskOf: headers and subject, never only a body that may be what
// failed), else under seq-N; its Dispatch-Task-Id and Dispatch-Pass say
// which task and pass it stopped, so review can act on the task. Its
// Msg-Id derives from the original's stream position, so the router and
// the reaper never record the same message twice.
func DeadLetter(m *Msg, stream, reason, key string, cause error) Out {
	id, pass := TaskOf(m)
	if key == "" {
		key = id
	}
	if !events.ValidID(key) {
		key = "seq-" + strconv.FormatUint(m.Seq, 10)
	}
	h := nats.Header{}
	for k, v := range m.Header {
		// A client's Dispatch-* headers are not the mesh's: a submission's
		// record says only what the mesh found.
		if len(k) > 9 && k[:9] == "Dispatch-" && !FromClient(m.Subject) {
			h[k] = v
		}
	}
	if key == id {
		h.Set(events.HeaderTaskID, id)
		if pass > 0 {
			h.Set(events.HeaderPass, strconv.Itoa(pass))
		}
	}
	h.Set(events.HeaderEvent, "review."+reason+".v1")
	h.Set(events.HeaderReason, reason)
	h.Set(events.HeaderError, cause.Error())
	h.Set(events.HeaderOrigSubj, m.Subject)
	h.Set(events.HeaderOrigSeq, strconv.FormatUint(m.Seq, 10))
	return Out{
		Subject: events.ReviewSubject(reason, key),
		MsgID:   fmt.Sprintf("review:%s:%d", stream, m.Seq),
		Header:  h,
		Data:    KeepBody(h, m.Data),
	}
}

// MaxKeptBody is the most of a message's bytes a review record keeps: with
// its headers it must fit the streams' MaxEventSize, or the record could
// never be stored and the input it records would be lost.
const MaxKeptBody = MaxEventSize - 64<<10

// KeepBody is what a record keeps of data: all of it up to MaxKeptBody,
// else its first MaxKeptBody bytes, with the original's size and SHA-256
// in h (Dispatch-Orig-Size, Dispatch-Orig-Sha256).
func KeepBody(h nats.Header, data []byte) []byte {
	if len(data) <= MaxKeptBody {
		return data
	}
	sum := sha256.Sum256(data)
	h.Set(events.HeaderOrigSize, strconv.Itoa(len(data)))
	h.Set(events.HeaderOrigSHA256, hex.EncodeToString(sum[:]))
	return data[:MaxKeptBody]
}
