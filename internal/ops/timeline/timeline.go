// Package timeline reads one task's events back from the stream, in order:
// `dispatch submit --wait` follows them live and `dispatch audit` prints them.
package timeline

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Entry is one event of a task as stored on the stream.
type Entry struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Subject string    `json:"subject"`
	Event   string    `json:"event"`
	Stage   string    `json:"stage"` // the stage, or review.<reason>
	By      string    `json:"by,omitempty"`
	Error   string    `json:"error,omitempty"`
	// Pass is the Dispatch-Pass header: the task's pass the event belongs
	// to, known even when the body does not decode (0: not given).
	Pass int             `json:"pass,omitempty"`
	Data json.RawMessage `json:"data,omitempty"`
}

// Final reports whether the entry ends the task (until a human acts), and
// whether it ended well.
func (e Entry) Final() (final, ok bool) {
	switch e.Stage {
	case events.StageSucceeded:
		return true, true
	case events.StageCancelled:
		return true, false
	}
	return strings.HasPrefix(e.Stage, "review."), false
}

// Filters match every event of the task: its stage events, its review
// records and human decisions, and its webhook deliveries.
func Filters(id string) []string {
	return []string{events.TaskFilter(id), events.ReviewTaskFilter(id), events.WebhookTaskFilter(id)}
}

// Follow delivers the task's events in stream order to fn, from the first,
// until fn returns false or ctx ends. With live false it stops at the end of
// what is stored now.
func Follow(ctx context.Context, js jetstream.JetStream, id string, live bool, fn func(Entry) bool) error {
	if !events.ValidID(id) {
		return fmt.Errorf("invalid task id %q", id)
	}
	cons, err := js.OrderedConsumer(ctx, services.Stream, jetstream.OrderedConsumerConfig{
		// Readers come and go (every page, every command): let the server
		// drop a forgotten consumer soon instead of after 5 minutes.
		InactiveThreshold: 10 * time.Second,
		FilterSubjects:    Filters(id),
		DeliverPolicy:     jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return err
	}
	for {
		if !live {
			info, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			if info.NumPending == 0 {
				return nil
			}
		}
		var batch jetstream.MessageBatch
		if live {
			batch, err = cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
		} else {
			batch, err = cons.FetchNoWait(100) // what is stored now, no waiting for more
		}
		if err != nil {
			return err
		}
		for msg := range batch.Messages() {
			if !fn(FromMsg(msg)) {
				return nil
			}
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// FromMsg reads a stored message as a timeline entry.
func FromMsg(msg jetstream.Msg) Entry {
	e := Entry{Subject: msg.Subject(), Data: msg.Data()}
	if md, err := msg.Metadata(); err == nil {
		e.Seq, e.Time = md.Sequence.Stream, md.Timestamp
	}
	h := msg.Headers()
	e.Event, e.By, e.Error = h.Get(events.HeaderEvent), h.Get(events.HeaderService), h.Get(events.HeaderError)
	if n, err := strconv.Atoi(h.Get(events.HeaderPass)); err == nil && n > 0 {
		e.Pass = n
	}
	if _, stage, ok := events.ParseTaskSubject(e.Subject); ok {
		e.Stage = stage
	} else if reason, _, ok := events.ParseReviewSubject(e.Subject); ok {
		e.Stage = "review." + reason
	} else if kind, _, ok := events.ParseWebhookSubject(e.Subject); ok {
		e.Stage = "webhook." + kind
	}
	if !json.Valid(e.Data) {
		e.Data = nil
	}
	return e
}

// Summary is a one-line description of an entry for people.
func (e Entry) Summary() string {
	if strings.HasPrefix(e.Stage, "webhook.") || e.Stage == "review."+events.ReviewWebhook {
		return e.webhookSummary()
	}
	var v struct {
		Run          events.Run            `json:"run"`
		Verification *events.Verification  `json:"verification"`
		Trust        *events.TrustDecision `json:"trust"`
		Prompt       *events.Prompt        `json:"prompt"`
		Result       *events.Result        `json:"result"`
		Reason       string                `json:"reason"`
		Task         events.Task           `json:"task"`
	}
	_ = json.Unmarshal(e.Data, &v)
	parts := []string{fmt.Sprintf("attempt=%d", v.Run.Attempt)}
	switch {
	case e.Stage == events.StageQueued:
		parts = append(parts, fmt.Sprintf("type=%s subject=%q", v.Task.Type, v.Task.Subject))
	case v.Verification != nil:
		parts = append(parts, "verdict="+v.Verification.Verdict+" verifier="+v.Verification.Verifier)
		if v.Verification.Detail != "" {
			parts = append(parts, fmt.Sprintf("detail=%q", clip(v.Verification.Detail, 80)))
		}
	case v.Trust != nil && e.Stage == events.StageAdmitted:
		parts = append(parts, fmt.Sprintf("trust=%.2f outcomes=%d", v.Trust.Score, v.Trust.Outcomes))
		if v.Trust.Probe {
			parts = append(parts, "probe")
		}
		if v.Trust.Exempt {
			parts = append(parts, "exempt")
		}
	case v.Prompt != nil:
		parts = append(parts, fmt.Sprintf("model=%s messages=%d", v.Prompt.Model, len(v.Prompt.Messages)))
	case v.Result != nil:
		parts = append(parts, "outcome="+v.Result.Outcome, fmt.Sprintf("tokens=%d/%d", v.Result.TokensIn, v.Result.TokensOut))
		if v.Result.Model != "" {
			parts = append(parts, "model="+v.Result.Model)
		}
		if v.Result.Approach != "" {
			parts = append(parts, fmt.Sprintf("approach=%q", clip(v.Result.Approach, 60)))
		}
		if v.Result.Error != "" {
			parts = append(parts, fmt.Sprintf("error=%q", clip(v.Result.Error, 80)))
		}
	}
	if v.Reason != "" {
		parts = append(parts, fmt.Sprintf("reason=%q", clip(v.Reason, 100)))
	} else if e.Error != "" {
		parts = append(parts, fmt.Sprintf("error=%q", clip(e.Error, 100)))
	}
	return strings.Join(parts, " ")
}

// clip is s on one line, cut to n bytes (and "…").
func clip(s string, n int) string {
	return textcut.Clip(strings.ReplaceAll(s, "\n", " "), n)
}

// webhookSummary describes a webhook event or its review record.
func (e Entry) webhookSummary() string {
	var v struct {
		events.WebhookTry
		Due      *events.WebhookDue `json:"due"`
		Attempts int                `json:"attempts"`
		LastErr  string             `json:"last_error"`
	}
	_ = json.Unmarshal(e.Data, &v)
	if d := v.Due; d != nil { // given up (review.webhook)
		v.DeliveryID, v.URL, v.Attempt, v.Error = d.DeliveryID, d.URL, v.Attempts, v.LastErr
	}
	parts := []string{"delivery=" + v.DeliveryID}
	if v.Attempt > 0 {
		parts = append(parts, fmt.Sprintf("attempt=%d", v.Attempt))
	}
	if v.Code != 0 {
		parts = append(parts, fmt.Sprintf("code=%d", v.Code))
	}
	parts = append(parts, fmt.Sprintf("url=%q", clip(v.URL, 100)))
	if v.Error != "" {
		parts = append(parts, fmt.Sprintf("error=%q", clip(v.Error, 100)))
	}
	if !v.NextAt.IsZero() {
		parts = append(parts, "next="+v.NextAt.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, " ")
}

// Stages lists the stages of entries, in order.
func Stages(entries []Entry) []string {
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Stage)
	}
	return out
}

// Count counts the entries of stage.
func Count(entries []Entry, stage string) int {
	n := 0
	for _, e := range entries {
		if e.Stage == stage {
			n++
		}
	}
	return n
}
