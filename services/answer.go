package services

import (
	"context"
	"errors"

	json "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// WaitAnswer is the wait answer for a task in state st (events.WaitReply):
// where it stands — the stage of its latest event on stream — and the
// final answer of a succeeded task. What cannot be read (ctx bounds the
// reads) is left out. The request API's wait and the webhook service answer
// with it.
func WaitAnswer(ctx context.Context, stream jetstream.Stream, st events.TaskState, timedOut bool) events.WaitReply {
	r := events.NewWaitReply(st)
	r.TimedOut = timedOut
	r.Stage = lastStage(ctx, stream, st.ID)
	if st.Status == events.StatusSucceeded {
		r.Result = finalResult(ctx, stream, st)
	}
	return r
}

// lastStage is the stage of the task's latest event: its last task event or
// review record, whichever is later.
func lastStage(ctx context.Context, stream jetstream.Stream, id string) string {
	var latest *jetstream.RawStreamMsg
	for _, filter := range []string{events.TaskFilter(id), events.ReviewTaskFilter(id)} {
		if m, err := stream.GetLastMsgForSubject(ctx, filter); err == nil && (latest == nil || m.Sequence > latest.Sequence) {
			latest = m
		}
	}
	if latest == nil {
		return ""
	}
	if _, stage, ok := events.ParseTaskSubject(latest.Subject); ok {
		return stage
	}
	if reason, _, ok := events.ParseReviewSubject(latest.Subject); ok {
		return "review." + reason
	}
	return ""
}

// finalResult is the final answer of a succeeded task: the succeeded event's
// result. The recorder stores the task's state before it publishes that
// event; until it is stored, the success the recorder read (the pass's
// executed event) is the same result. Nil when a human resolved the task.
func finalResult(ctx context.Context, stream jetstream.Stream, st events.TaskState) *events.Result {
	if m, err := stream.GetLastMsgForSubject(ctx, events.TaskSubject(st.ID, events.StageSucceeded)); err == nil {
		var ev events.Succeeded
		if json.Unmarshal(m.Data, &ev) == nil {
			return &ev.Result
		}
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	m, err := stream.GetLastMsgForSubject(ctx, events.TaskSubject(st.ID, events.StageExecuted))
	if err != nil {
		return nil
	}
	var ev events.Executed
	if json.Unmarshal(m.Data, &ev) != nil || ev.Result.Outcome != events.OutcomeSuccess || ev.Run.Pass != st.Pass {
		return nil
	}
	return &ev.Result
}
