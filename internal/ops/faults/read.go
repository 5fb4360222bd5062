package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Terminal records: the one record that ends a task (until a human acts).
const (
	EndSucceeded = events.StageSucceeded  // dispatch.task.<id>.succeeded
	EndCancelled = events.StageCancelled  // dispatch.task.<id>.cancelled
	EndGated     = events.ReviewGated     // dispatch.review.gated.<id>
	EndEscalated = events.ReviewEscalated // dispatch.review.escalated.<id>
	EndStuck     = events.ReviewStuck     // dispatch.review.stuck.<id>
	EndPoison    = events.ReviewPoison    // dispatch.review.poison.<id>
	EndRejected  = events.ReviewRejected  // dispatch.review.rejected.<id>
	endRungRate  = "escalated (" + string(events.CauseRungRate) + ")"
)

// ending is one terminal record of a task on the stream.
type ending struct {
	Kind  string
	Seq   uint64
	Pass  int
	Cause events.Cause
	At    time.Time // the record's time (Base.At)
	// Attempt is the record's run's attempt.
	Attempt int
}

func (e ending) String() string {
	if e.Cause != "" {
		return fmt.Sprintf("%s (%s, pass %d, seq %d)", e.Kind, e.Cause, e.Pass, e.Seq)
	}
	return fmt.Sprintf("%s (pass %d, seq %d)", e.Kind, e.Pass, e.Seq)
}

// taskEvents is what the stream holds of one task.
type taskEvents struct {
	submits, queued int
	indexed         int // entries in the task index (dispatch.index.>)
	// executed are the Executed events by pass, in stream order;
	// executedAt when the stream stored each pass's first (what the
	// recorder dates the attempt by).
	executed   map[int][]events.Executed
	executedAt map[int]time.Time
	endings    []ending
	held       int // held events (the gate held a pass)
	// last is the stage of the task's latest event and when it was stored.
	last     string
	lastTime time.Time
	// trail is every event of the task: stage, pass.attempt, stream
	// sequence and the instance that published it.
	trail []string
}

// streamView is the whole DISPATCH stream, by task.
type streamView struct {
	tasks map[string]*taskEvents
	// stages counts the stream's messages per stage (submissions under
	// "submit"): what each durable consumer had to deliver once.
	stages map[string]int
	// admitted counts the passes the gate let through, by cause.
	admitted map[string]int
	msgs     int
}

func newTaskEvents() *taskEvents {
	return &taskEvents{executed: map[int][]events.Executed{}, executedAt: map[int]time.Time{}}
}

func (v *streamView) task(id string) *taskEvents {
	te := v.tasks[id]
	if te == nil {
		te = newTaskEvents()
		v.tasks[id] = te
	}
	return te
}

// readStream reads every submission (DISPATCH_SUBMIT), then every message
// of the DISPATCH stream.
func readStream(ctx context.Context, js jetstream.JetStream) (*streamView, error) {
	v := &streamView{tasks: map[string]*taskEvents{}, stages: map[string]int{}, admitted: map[string]int{}}
	for _, stream := range []string{services.SubmitStream, services.Stream} {
		err := readAll(ctx, js, stream, func(msg jetstream.Msg, md *jetstream.MsgMetadata) error {
			v.msgs++
			return v.add(msg.Subject(), msg.Headers().Get(events.HeaderTaskID), msg.Data(), md)
		})
		if err != nil {
			return v, err
		}
	}
	return v, nil
}

func (v *streamView) add(subject, taskHeader string, data []byte, md *jetstream.MsgMetadata) error {
	var base struct {
		Run events.Run `json:"run"`
		By  string     `json:"by"`
	}
	if id, stage, ok := events.ParseTaskSubject(subject); ok {
		v.stages[stage]++
		te := v.task(id)
		te.last, te.lastTime = stage, md.Timestamp
		_ = json.Unmarshal(data, &base)
		te.trail = append(te.trail, trailEntry(stage, base.Run, md.Sequence.Stream, base.By))
		switch stage {
		case events.StageQueued:
			te.queued++
		case events.StageVerified:
			// A type without a verifier: intake's first event is verified
			// (pass 1, published by intake), in place of queued. The
			// verifier's verified of a pass, or the recorder's of a retry,
			// is no such event.
			if base.Run.Pass == 1 && strings.HasPrefix(base.By, services.ConsumerIntake+"@") {
				te.queued++
			}
		case events.StageExecuted:
			var ev events.Executed
			if err := json.Unmarshal(data, &ev); err != nil {
				return fmt.Errorf("executed of %s (seq %d): %w", id, md.Sequence.Stream, err)
			}
			te.executed[ev.Run.Pass] = append(te.executed[ev.Run.Pass], ev)
			if _, ok := te.executedAt[ev.Run.Pass]; !ok {
				te.executedAt[ev.Run.Pass] = md.Timestamp.UTC()
			}
		case events.StageAdmitted:
			var ev events.Admitted
			if json.Unmarshal(data, &ev) == nil {
				v.admitted[string(ev.Trust.Cause)]++
			}
		case events.StageHeld:
			te.held++
		case events.StageSucceeded, events.StageCancelled:
			te.endings = append(te.endings, ending{Kind: stage, Seq: md.Sequence.Stream, Pass: base.Run.Pass})
		}
		return nil
	}
	if reason, key, ok := events.ParseReviewSubject(subject); ok {
		v.stages["review."+reason]++
		if reason == events.ReviewAction {
			return nil
		}
		id := key
		if taskHeader != "" {
			id = taskHeader
		}
		te := v.task(id)
		te.last, te.lastTime = "review."+reason, md.Timestamp
		var ev struct {
			Run   events.Run   `json:"run"`
			Cause events.Cause `json:"cause"`
			At    time.Time    `json:"at"`
			By    string       `json:"by"`
		}
		_ = json.Unmarshal(data, &ev) // a poison or rejected record keeps the original bytes
		te.trail = append(te.trail, trailEntry("review."+reason, ev.Run, md.Sequence.Stream, ev.By))
		te.endings = append(te.endings, ending{Kind: reason, Seq: md.Sequence.Stream, Pass: ev.Run.Pass, Cause: ev.Cause, At: ev.At, Attempt: ev.Run.Attempt})
		return nil
	}
	if strings.HasPrefix(subject, events.IndexRoot+".") {
		v.stages["index"]++
		var e events.IndexEntry
		if json.Unmarshal(data, &e) == nil && e.ID != "" {
			v.task(e.ID).indexed++
		}
		return nil
	}
	if _, ok := strings.CutPrefix(subject, events.SubmitRoot+"."); ok {
		v.stages["submit"]++
		var s events.Submit
		if json.Unmarshal(data, &s) == nil && s.ID != "" {
			v.task(s.ID).submits++
		}
	}
	return nil
}

// trailEntry is one event in a task's trail:
// "<stage>/<pass>.<attempt>#<stream sequence>@<publisher>".
func trailEntry(stage string, run events.Run, seq uint64, by string) string {
	return fmt.Sprintf("%s/%d.%d#%d@%s", stage, run.Pass, run.Attempt, seq, by)
}

// readAll delivers every message stored in stream now to fn, in order.
func readAll(ctx context.Context, js jetstream.JetStream, stream string, fn func(jetstream.Msg, *jetstream.MsgMetadata) error) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{InactiveThreshold: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				return err
			}
			if err := fn(msg, md); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		if n == 0 {
			return fmt.Errorf("read %s: stalled with %d messages pending", stream, pending)
		}
		pending -= uint64(n)
	}
	return nil
}

// readBucket returns every value of a KV bucket, decoded.
func readBucket[T any](ctx context.Context, js jetstream.JetStream, bucket string) (map[string]T, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	w, err := follow.WatchAll(ctx, js, kv, follow.WatchOptions{IgnoreDeletes: true})
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	defer w.Stop()
	out := map[string]T{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("bucket %s: the watch stopped before the initial values", bucket)
			}
			if e == nil {
				return out, nil
			}
			var v T
			if err := json.Unmarshal(e.Value(), &v); err != nil {
				return nil, fmt.Errorf("bucket %s key %s: %w", bucket, e.Key(), err)
			}
			out[e.Key()] = v
		}
	}
}

// consumerStage is the stage (streamView.stages key) each durable consumes.
var consumerStage = map[string][]string{
	services.ConsumerIntake:   {"submit"},
	services.ConsumerVerifier: {events.StageQueued, events.StageRetry},
	services.ConsumerGate:     {events.StageVerified},
	services.ConsumerGateHeld: {events.StageHeld},
	services.ConsumerGateWake: {events.StageWake},
	services.ConsumerPrompt:   {events.StageAdmitted},
	services.ConsumerExecutor: {events.StagePrompted},
	services.ConsumerRecorder: {events.StageExecuted, "review." + events.ReviewAction}, // and the human actions it counts
}

// Durables are the stage consumers of DISPATCH, in pipeline order.
var Durables = []string{services.ConsumerIntake, services.ConsumerVerifier, services.ConsumerGate,
	services.ConsumerGateHeld, services.ConsumerGateWake, services.ConsumerPrompt, services.ConsumerExecutor, services.ConsumerRecorder}

// redeliveries is, per durable, how many deliveries went beyond each
// message's first: the consumer's delivery sequence counts every delivery,
// the stream how many messages it had to deliver. Kills (an unacked message
// comes back after AckWait) and snoozes (a nak with a delay: canary waits,
// transient errors) both count.
func redeliveries(ctx context.Context, js jetstream.JetStream, v *streamView) (map[string]int, error) {
	out := map[string]int{}
	for _, name := range Durables {
		cons, err := js.Consumer(ctx, services.StreamOf(name), name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", name, err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", name, err)
		}
		msgs := 0
		for _, stage := range consumerStage[name] {
			msgs += v.stages[stage]
		}
		out[name] = max(0, int(info.Delivered.Consumer)-msgs)
	}
	return out, nil
}

// Idle reports whether every stage consumer has delivered and settled
// everything: nothing pending, nothing delivered and not yet acked (so
// nothing can be redelivered), and says what is still in flight when not.
func Idle(ctx context.Context, js jetstream.JetStream) (bool, string, error) {
	var busy []string
	for _, name := range slices.Concat(Durables, []string{services.ConsumerReaper}) {
		stream := services.StreamOf(name)
		cons, err := js.Consumer(ctx, stream, name)
		if err != nil {
			return false, "", fmt.Errorf("consumer %s: %w", name, err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return false, "", fmt.Errorf("consumer %s: %w", name, err)
		}
		// A pass held for trust is acked asleep in the held index: what a
		// consumer still holds is in flight (a canary wait, a look).
		if info.NumPending > 0 || info.NumAckPending > 0 {
			busy = append(busy, fmt.Sprintf("%s: %d pending, %d unacked", name, info.NumPending, info.NumAckPending))
		}
	}
	return len(busy) == 0, fmt.Sprint(busy), nil
}

// readOutcomes reads each type's outcomes from the outcome stream as the
// gate sees them (trust.View).
func readOutcomes(ctx context.Context, js jetstream.JetStream) (map[string][]trust.Outcome, error) {
	v, err := trust.NewView(ctx, js, nil, slog.New(slog.DiscardHandler)) // what it leaves out, copies reports
	if err != nil {
		return nil, err
	}
	defer v.Stop()
	out := map[string][]trust.Outcome{}
	for _, st := range v.All() {
		out[st.Type] = st.Outcomes
	}
	return out, nil
}

// copies counts the messages stored for each key on each subject of a
// stream of recorder messages (the outcome stream): more than one is an
// outcome published again after the deduplication window, and counted
// twice by whoever reads it. A message without a key, which no recorder
// publishes, is counted under "".
func copies(ctx context.Context, js jetstream.JetStream, stream string) (map[string]map[string]int, error) {
	out := map[string]map[string]int{}
	err := readAll(ctx, js, stream, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) error {
		var m struct {
			Key string `json:"key"`
		}
		_ = json.Unmarshal(msg.Data(), &m)
		keys := out[msg.Subject()]
		if keys == nil {
			keys = map[string]int{}
			out[msg.Subject()] = keys
		}
		keys[m.Key]++
		return nil
	})
	return out, err
}
