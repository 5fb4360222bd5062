// Package review is the human side of the mesh (SPEC §9): the queue of
// everything on the review subjects dispatch.review.<reason>.<id> (rejected
// input, gated, escalated, poison and stuck tasks) and the tasks the gate
// holds for their type's low trust (Held, from the gate's held index: they
// are on no review subject, but a human may act on them), the full record
// of one task (state, trust score, every attempt, dead ends, review
// records, the timeline), the three human decisions — resolve, reject,
// requeue — and cancel (stop a task that has not ended), and the task
// explorer (Tasks: every task, newest first, a page at a time, from the
// task index).
//
// Every decision is itself an event: an events.Action on
// dispatch.review.action.<id>, and an entry in the task's TaskState.Actions,
// written with compare-and-set. A requeue also publishes a task.retry.v1 that
// starts a fresh round of attempts with the reviewer's note for the prompt.
//
// The CLI (`dispatch review`, `dispatch audit`) and the web page (package
// web) are two views of this package.
package review

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Errors of the review actions, compared with errors.Is.
var (
	// ErrNotFound: neither a task state nor a review record has this id.
	ErrNotFound = errors.New("review: no task or review record with this id")
	// ErrNotReviewable: the task is not waiting for a human (it is pending,
	// running, parked or already succeeded). See StateError.
	ErrNotReviewable = errors.New("review: task is not waiting for a human")
	// ErrNoTask: there is no task to send again — the review record has no
	// task (rejected input that never became a task), or no event of the
	// task holds one that can be (aged out, undecodable): it can be
	// resolved or rejected, not requeued.
	ErrNoTask = errors.New("review: no task state for this record")
	// ErrInvalid: a missing note or reviewer, an invalid id, a bad filter.
	ErrInvalid = errors.New("review: invalid request")
)

// Limits on what a reviewer types.
const (
	MaxNoteLen = 4000
	MaxByLen   = 200
)

// Config of a Client. Only JS is required.
type Config struct {
	// JS is the JetStream context (required).
	JS jetstream.JetStream
	// Stream holds the task events and review records. Default services.Stream.
	Stream string
	// Policy supplies per-type thresholds and exemptions for trust scores.
	// Default nil: built-in defaults.
	Policy *policy.Source
	// Scoring is the trust scoring policy (zero fields: SPEC defaults). Use
	// the same as the gate, or the scores shown differ from the gate's.
	Scoring trust.Policy
	// Log receives a line per human action. Default slog.Default().
	Log *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// MaxSubscribers bounds the pages following the live feed at once
	// (Live.Subscribe). Default DefaultMaxSubscribers.
	MaxSubscribers int
}

// Client reads the review queue and records human decisions. It binds to the
// KV buckets on first use, so it can be created before the mesh provisioned
// them (`dispatch up` starts the web page and the mesh together).
type Client struct {
	cfg Config

	mu     sync.Mutex
	tasks  *services.TaskStore
	trust  *trust.View
	opened bool
	open   *openQueue // OpenCounts' reading, kept between calls
	live   *Live      // the live feed and search index, once started
}

// New returns a client; it does not talk to the server yet.
func New(cfg Config) (*Client, error) {
	if cfg.JS == nil {
		return nil, fmt.Errorf("%w: JS is required", ErrInvalid)
	}
	if cfg.Stream == "" {
		cfg.Stream = services.Stream
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Client{cfg: cfg}, nil
}

// taskStore opens only the task bucket: what the explorer and a cancel
// need, so a user that may not read trust (the client user) can use them.
func (c *Client) taskStore(ctx context.Context) (*services.TaskStore, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tasks != nil {
		return c.tasks, nil
	}
	tasks, err := c.cfg.JS.KeyValue(ctx, services.BucketTasks)
	if err != nil {
		return nil, fmt.Errorf("bucket %s (is the mesh provisioned? run `dispatch up`): %w", services.BucketTasks, err)
	}
	c.tasks = services.NewTaskStore(tasks)
	return c.tasks, nil
}

// stores opens the task bucket and the trust view once: the view follows
// the outcome stream and the gate facts until Close.
func (c *Client) stores(ctx context.Context) (*services.TaskStore, *trust.View, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opened {
		return c.tasks, c.trust, nil
	}
	if c.tasks == nil {
		tasks, err := c.cfg.JS.KeyValue(ctx, services.BucketTasks)
		if err != nil {
			return nil, nil, fmt.Errorf("bucket %s (is the mesh provisioned? run `dispatch up`): %w", services.BucketTasks, err)
		}
		c.tasks = services.NewTaskStore(tasks)
	}
	tr, err := c.cfg.JS.KeyValue(ctx, services.BucketTrust)
	if err != nil {
		return nil, nil, fmt.Errorf("bucket %s (is the mesh provisioned? run `dispatch up`): %w", services.BucketTrust, err)
	}
	view, err := trust.NewView(ctx, c.cfg.JS, tr, c.cfg.Log)
	if err != nil {
		return nil, nil, fmt.Errorf("trust (is the mesh provisioned? run `dispatch up`): %w", err)
	}
	c.trust, c.opened = view, true
	return c.tasks, c.trust, nil
}

// Close stops following the trust of every type (see Trust) and the live
// feed (see Live).
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.trust != nil {
		c.trust.Stop()
		c.trust, c.opened = nil, false
	}
	if c.live != nil {
		c.live.Close()
		c.live = nil
	}
}
