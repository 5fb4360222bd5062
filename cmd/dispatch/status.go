package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

// statusJSON is what `dispatch status -o json` prints: the task's state
// and, once it has ended, its final answer.
type statusJSON struct {
	client.State
	Result *client.Result `json:"result,omitempty"`
}

// statusVerboseJSON adds, with -v, the payload (null when the task's
// first event has none or aged out) and every attempt's answer.
type statusVerboseJSON struct {
	statusJSON
	Payload json.RawMessage `json:"payload"`
	Answers []review.Answer `json:"answers"`
}

// taskStory is what `dispatch status -v` adds to the state: what the task
// page shows beyond it, read from the task's events on the stream.
type taskStory struct {
	Payload json.RawMessage
	Answers []review.Answer
}

// readStory reads the task's events on nc (the client user may: dispatch
// audit does the same) and takes the payload and the answers from them,
// as the task page does (review.Payload, review.Answers). It needs no
// policy, so it logs nothing.
func readStory(ctx context.Context, cfg Config, nc *nats.Conn, id string) (*taskStory, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	rc, err := review.New(review.Config{JS: js, Log: cfg.logger()})
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	entries, err := rc.Timeline(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("task %s: its events: %w", id, err)
	}
	return &taskStory{Payload: review.Payload(entries), Answers: review.Answers(entries)}, nil
}

// printStory prints the payload and every answer, as the task page shows
// them: per attempt its pass, rung or step, model, outcome, approach,
// summary, changes, error (clipped as on the page), tokens, cost and how
// long the call took.
func printStory(out io.Writer, s taskStory) {
	fmt.Fprintln(out, "\nPAYLOAD")
	if len(s.Payload) == 0 {
		fmt.Fprintln(out, "  (none, or its queued event aged out)")
	} else {
		fmt.Fprintln(out, indent(review.IndentPayload(s.Payload), "  "))
	}
	fmt.Fprintln(out, "\nWHAT THE MODEL ANSWERED")
	if len(s.Answers) == 0 {
		fmt.Fprintln(out, "  (no answer recorded)")
	}
	for _, a := range s.Answers {
		where := dash(string(a.Rung))
		if a.Step != "" {
			where += " " + a.Step
		}
		model := dash(a.Model)
		if a.Simulated {
			model += " (simulated)"
		}
		took := (time.Duration(a.DurationMS) * time.Millisecond).String()
		fmt.Fprintf(out, "attempt %d  pass %d  %s  %s  model %s  %d/%d tokens  $%.4f  took %s\n",
			a.Attempt, a.Pass, where, dash(a.Outcome), model, a.TokensIn, a.TokensOut, a.Cost, took)
		if a.Approach != "" {
			fmt.Fprintf(out, "  approach: %s\n", oneLine(a.Approach, 400))
		}
		if a.Summary != "" {
			fmt.Fprintf(out, "  summary: %s\n", oneLine(a.Summary, 400))
		}
		for _, ch := range a.Changes {
			fmt.Fprintf(out, "  change: %s\n", oneLine(ch, 400))
		}
		if a.Error != "" {
			fmt.Fprintf(out, "  error: %s\n", oneLine(a.Error, 400))
		}
	}
}

// indent prefixes every line of s.
func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix)
}
