package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Limits of the live feed.
const (
	// DefaultMaxSubscribers bounds the pages following the feed at once
	// (Config.MaxSubscribers): one more is refused (ErrTooManySubscribers).
	DefaultMaxSubscribers = 256
	// subscriberBuffer is how many changes wait for a slow subscriber;
	// beyond it the subscriber's next change says Lost (reload all).
	subscriberBuffer = 64
)

// ErrTooManySubscribers: the live feed has as many subscribers as it
// takes.
var ErrTooManySubscribers = errors.New("review: too many pages follow the live feed; close some")

// Change is one change of a task's state, as the live feed passes it on.
type Change struct {
	ID     string        `json:"id"`
	Type   string        `json:"type,omitempty"`
	Status events.Status `json:"status,omitempty"`
	// Deleted: the task's state is gone.
	Deleted bool `json:"deleted,omitempty"`
	// Lost: changes were dropped before this one because the subscriber
	// did not keep up; whatever it shows may be stale.
	Lost bool `json:"lost,omitempty"`
}

// Live is the one watch of a process on the task bucket — a follower of
// its stream, KV_dispatch_tasks: the newest state of each task, then every
// change — (and one follower of the answers on the stream), fanned out to every page that follows it
// (Subscribe) and kept as the search index (Tasks with TaskQuery.Text): a
// page that follows tasks live costs a channel, not a watch or a polling
// loop of its own. Client.Live starts it on first use; Client.Close stops
// it.
type Live struct {
	index *searchIndex
	ready chan struct{} // closed once the bucket's current states are in
	done  chan struct{} // closed when the watch ends
	stop  func()
	log   *slog.Logger

	mu   sync.Mutex
	subs map[*Subscription]struct{}
	max  int
	err  error // why the watch ended
}

// Subscription is one page following the feed: changes arrive on C until
// Close (or the feed ends: C is then closed).
type Subscription struct {
	C    <-chan Change
	c    chan Change
	live *Live
	lost bool // guarded by live.mu
}

// Close leaves the feed; C is not read any more.
func (s *Subscription) Close() {
	s.live.mu.Lock()
	defer s.live.mu.Unlock()
	if _, ok := s.live.subs[s]; ok {
		delete(s.live.subs, s)
		close(s.c)
	}
}

// Subscribe follows every change of every task's state from now on.
func (l *Live) Subscribe() (*Subscription, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs == nil {
		return nil, fmt.Errorf("review: the live feed ended: %v", l.err)
	}
	if len(l.subs) >= l.max {
		return nil, ErrTooManySubscribers
	}
	s := &Subscription{c: make(chan Change, subscriberBuffer), live: l}
	s.C = s.c
	l.subs[s] = struct{}{}
	return s, nil
}

// Subscribers is how many pages follow the feed now.
func (l *Live) Subscribers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.subs)
}

// publish passes a change to every subscriber without waiting: one whose
// buffer is full misses it, and its next change says Lost.
func (l *Live) publish(ch Change) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs {
		c := ch
		c.Lost = s.lost
		select {
		case s.c <- c:
			s.lost = false
		default:
			s.lost = true
		}
	}
}

// end closes every subscription: the feed is over.
func (l *Live) end(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs {
		close(s.c)
	}
	l.subs, l.err = nil, err
}

// Ready waits until the search index holds every task's current state.
func (l *Live) Ready(ctx context.Context) error {
	select {
	case <-l.ready:
		return nil
	case <-l.done:
		return fmt.Errorf("review: the live feed ended: %v", l.err)
	case <-ctx.Done():
		return fmt.Errorf("the task index is still loading: %w", ctx.Err())
	}
}

// Live returns the process's live feed, starting it on first use.
func (c *Client) Live(ctx context.Context) (*Live, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live != nil {
		select {
		case <-c.live.done: // the watch ended (its error is logged): start another
			c.live.stop()
			c.live = nil
		default:
			return c.live, nil
		}
	}
	max := c.cfg.MaxSubscribers
	if max <= 0 {
		max = DefaultMaxSubscribers
	}
	// The feed outlives the request that started it: it stops at Close.
	lctx, cancel := context.WithCancel(context.Background())
	l := &Live{index: newSearchIndex(), ready: make(chan struct{}), done: make(chan struct{}),
		subs: map[*Subscription]struct{}{}, max: max, log: c.cfg.Log}
	// The bucket's stream, newest message of each key first, then every
	// change: a Follower checks each delivery came from its own consumer.
	// (Unlike follow.Watch, no state is read back by revision: loading
	// 100,000 states that way took 18 s, this way 3.5 s. The feed only
	// shows and finds tasks; every decision reads the state afresh.)
	loaded := false // on the follower's goroutine only
	prefix := "$KV." + services.BucketTasks + "."
	states, err := follow.Stream(lctx, c.cfg.JS, follow.Config{
		Stream: events.KVStream(services.BucketTasks), Filters: []string{prefix + ">"},
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FlowControl: true, Log: c.cfg.Log,
		CaughtUp: func() { loaded = true; close(l.ready) },
	}, func(m follow.Msg) { l.take(strings.TrimPrefix(m.Subject, prefix), m, loaded) })
	if err != nil {
		cancel()
		return nil, fmt.Errorf("follow bucket %s (is the mesh provisioned? run `dispatch up`): %w", services.BucketTasks, err)
	}
	answers, err := follow.Stream(lctx, c.cfg.JS, follow.Config{
		Stream: c.cfg.Stream, Filters: []string{events.TaskSubject("*", events.StageExecuted)}, Log: c.cfg.Log,
	}, func(m follow.Msg) {
		var ex events.Executed
		id, _, _ := events.ParseTaskSubject(m.Subject)
		if json.Unmarshal(m.Data, &ex) == nil && events.ValidID(ex.Task.ID) && ex.Task.ID == id {
			l.index.answered(ex.Task.ID, ex.Result)
		}
	})
	if err != nil {
		states.Stop()
		cancel()
		return nil, fmt.Errorf("follow the answers: %w", err)
	}
	l.stop = func() { cancel(); answers.Stop(); states.Stop() }
	go l.pruneEvery(lctx, c.taskTTL(ctx))
	go func() {
		defer close(l.done)
		select {
		case <-states.Done():
			l.log.Warn("review: the live feed of the task bucket stopped; the next page starts another")
			l.end(errors.New("the feed of the task bucket stopped"))
		case <-lctx.Done():
			<-states.Done() // no take after end
			l.end(lctx.Err())
		}
	}()
	c.live = l
	return l, nil
}

// take passes one stored state into the index and, once the bucket's
// current states are in (loaded), to the subscribers.
func (l *Live) take(key string, m follow.Msg, loaded bool) {
	if follow.Operation(m.Header) != jetstream.KeyValuePut {
		l.index.remove(key)
		if loaded {
			l.publish(Change{ID: key, Deleted: true})
		}
		return
	}
	var st events.TaskState
	if json.Unmarshal(m.Data, &st) != nil || !events.ValidID(st.ID) || st.ID != key {
		return // not a state the mesh wrote: the explorer shows it by id as "no state"
	}
	l.index.put(st)
	if loaded {
		l.publish(Change{ID: st.ID, Type: st.Type, Status: st.Status})
	}
}

// pruneEvery drops from the index, every PruneEvery until ctx ends, the
// tasks the bucket expired (ttl: its MaxAge; 0, none: nothing expires).
func (l *Live) pruneEvery(ctx context.Context, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	t := time.NewTicker(PruneEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n := l.index.prune(now.Add(-ttl), now.Add(-time.Hour)); n > 0 {
				l.log.Info("review: expired tasks dropped from the search index", "tasks", n)
			}
		}
	}
}

// PruneEvery is how often the live feed drops expired tasks from its index.
const PruneEvery = 10 * time.Minute

// taskTTL is the task bucket's MaxAge, 0 when it cannot be read.
func (c *Client) taskTTL(ctx context.Context) time.Duration {
	s, err := c.cfg.JS.Stream(ctx, events.KVStream(services.BucketTasks))
	if err != nil {
		return 0
	}
	return s.CachedInfo().Config.MaxAge
}

// Close stops the feed: every subscription's channel is closed.
func (l *Live) Close() {
	l.stop()
	<-l.done
}

// waitReady bounds how long a search waits for the index to load.
const waitReady = 30 * time.Second
