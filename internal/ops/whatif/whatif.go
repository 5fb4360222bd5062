// Package whatif reads the DISPATCH stream (as rebuild reads it) into the
// events internal/core/whatif re-decides under a candidate policy.
package whatif

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	core "github.com/dispatchmesh/dispatchmesh/internal/core/whatif"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
)

// Result is a what-if replay of the stream.
type Result struct {
	core.Report
	// Skipped are the messages that could not be decoded (left out, as
	// rebuild leaves them out).
	Skipped []rebuild.Skipped `json:"skipped,omitempty"`
}

// Run reads the stream and re-decides it under o.Policy.
func Run(ctx context.Context, js jetstream.JetStream, o core.Options) (Result, error) {
	msgs, _, err := rebuild.Read(ctx, js)
	if err != nil {
		return Result{}, err
	}
	evs, skipped := Events(msgs)
	return Result{Report: core.Replay(evs, o), Skipped: skipped}, nil
}

// Events decodes the messages a what-if reads, in order; those it cannot
// decode are returned apart.
func Events(msgs []rebuild.Message) ([]core.Event, []rebuild.Skipped) {
	var out []core.Event
	var skipped []rebuild.Skipped
	for _, m := range msgs {
		ev, ok, err := Decode(m)
		if err != nil {
			skipped = append(skipped, rebuild.Skipped{Subject: m.Subject, Seq: m.Seq, Error: err.Error()})
			continue
		}
		if ok {
			out = append(out, ev)
		}
	}
	return out, skipped
}

// Decode is one message as the what-if reads it; ok is false for a
// message it does not read (a prompt, a wake, a canary wait, rejected
// input).
func Decode(m rebuild.Message) (ev core.Event, ok bool, err error) {
	ev.Stored = m.Stored
	if reason, _, isReview := events.ParseReviewSubject(m.Subject); isReview {
		return decodeReview(reason, m.Data, ev)
	}
	_, stage, isTask := events.ParseTaskSubject(m.Subject)
	if !isTask {
		return ev, false, nil
	}
	switch stage {
	case events.StageQueued:
		ev.Kind = core.KindQueued
		return ev, true, json.Unmarshal(m.Data, &ev.Base)
	case events.StageVerified:
		ev.Kind = core.KindVerified
		return ev, true, json.Unmarshal(m.Data, &ev.Base)
	case events.StageRetry:
		var r events.Retry
		err := json.Unmarshal(m.Data, &r)
		ev.Kind, ev.Base, ev.Reason = core.KindRetry, r.Base, r.Reason
		return ev, true, err
	case events.StageAdmitted:
		var a events.Admitted
		err := json.Unmarshal(m.Data, &a)
		ev.Kind, ev.Base, ev.Trust = core.KindAdmitted, a.Base, a.Trust
		return ev, true, err
	case events.StageHeld:
		var h events.Held
		err := json.Unmarshal(m.Data, &h)
		ev.Kind, ev.Base, ev.Trust, ev.Hold, ev.Reason = core.KindHeld, h.Base, h.Trust, h.Hold, h.Reason
		return ev, err == nil && h.Hold == events.HoldTrust || err != nil, err // a wait for canaries, a turn or a rung changes no fate: the look that ends it is another event
	case events.StageExecuted:
		var x events.Executed
		err := json.Unmarshal(m.Data, &x)
		ev.Kind, ev.Base, ev.Result = core.KindExecuted, x.Base, x.Result
		return ev, true, err
	case events.StageSucceeded:
		ev.Kind = core.KindSucceeded
		return ev, true, json.Unmarshal(m.Data, &ev.Base)
	case events.StageCancelled:
		var c events.Cancelled
		err := json.Unmarshal(m.Data, &c)
		ev.Kind, ev.Base, ev.Reason = core.KindCancelled, c.Base, c.Verification.Detail
		return ev, true, err
	}
	return ev, false, nil
}

func decodeReview(reason string, data []byte, ev core.Event) (core.Event, bool, error) {
	switch reason {
	case events.ReviewGated:
		var g events.Gated
		err := json.Unmarshal(data, &g)
		ev.Kind, ev.Base, ev.Trust, ev.Reason = core.KindGated, g.Base, g.Trust, g.Reason
		return ev, true, err
	case events.ReviewEscalated:
		var x events.Escalated
		err := json.Unmarshal(data, &x)
		ev.Kind, ev.Base, ev.Reason = core.KindEscalated, x.Base, x.Reason
		if x.Cause == events.CauseRungRate {
			ev.Kind, ev.Trust = core.KindHandoff, events.TrustDecision{Cause: x.Cause, Reason: x.Reason}
		}
		return ev, true, err
	case events.ReviewStuck:
		var s events.Stuck
		err := json.Unmarshal(data, &s)
		ev.Kind, ev.Base, ev.Reason = core.KindStuck, s.Base, s.Reason
		return ev, true, err
	case events.ReviewAction:
		err := json.Unmarshal(data, &ev.Action)
		ev.Kind = core.KindAction
		return ev, true, err
	}
	return ev, false, nil
}
