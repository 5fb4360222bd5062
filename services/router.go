package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
)

// Handler handles one message: it returns the messages to publish, or an
// error that decides the message's fate (see the package doc).
type Handler func(ctx context.Context, m *Msg) ([]Out, error)

// Spec describes one service: its durable consumer and its handler.
type Spec struct {
	// Name is the durable consumer's name; every instance of the service shares it.
	Name string
	// Stream is the stream consumed. Default Stream.
	Stream string
	// Filters are the consumer's subject filters.
	Filters []string
	// Handler handles each message.
	Handler Handler
	// Concurrency is how many messages one instance handles at once. Default 4.
	Concurrency int
	// MaxDeliver bounds deliveries of one message (naks included); on the last
	// one a failing message goes to dispatch.review.poison. Default 10.
	MaxDeliver int
	// AckWait is how long a delivered message is ours before the server
	// redelivers it; a heartbeat extends it while the handler runs. Default 30s.
	AckWait time.Duration
	// Backoff is the nak delay after the n-th failed delivery.
	// Default: 1s doubling per delivery, capped at 1m.
	Backoff func(delivered int) time.Duration
	// OnDemand pulls messages only for workers that are free, instead of
	// keeping Concurrency messages buffered. For slow handlers (model
	// calls): a buffered message's AckWait runs while it waits, and it could
	// be redelivered to another instance before this one even starts it.
	// One pull request asks for as many messages as workers are free, so a
	// burst reaches a thousand free workers in one round trip, not a
	// thousand.
	OnDemand bool
	// Stop, when set, is called once Run returns, after every handler
	// finished: it releases what the handler keeps between messages.
	Stop func()
}

func (s Spec) withDefaults() Spec {
	if s.Stream == "" {
		s.Stream = Stream
	}
	if s.Concurrency <= 0 {
		s.Concurrency = 4
	}
	if s.MaxDeliver <= 0 {
		s.MaxDeliver = 10
	}
	if s.AckWait <= 0 {
		s.AckWait = 30 * time.Second
	}
	if s.Backoff == nil {
		s.Backoff = ExpBackoff(time.Second, time.Minute)
	}
	return s
}

// ExpBackoff doubles base with each delivery, up to max.
func ExpBackoff(base, max time.Duration) func(int) time.Duration {
	return func(delivered int) time.Duration {
		d := base
		for i := 1; i < delivered && d < max; i++ {
			d *= 2
		}
		return min(d, max)
	}
}

// Router runs services: it consumes, calls handlers, publishes their outputs
// and settles each message.
type Router struct {
	JS jetstream.JetStream
	// Instance names this process in logs and headers (service@host:pid).
	Instance string
	Log      *slog.Logger
	Metrics  *Metrics
	// Grace is how long in-flight handlers may run after shutdown begins
	// before their context is cancelled (they then nak). Default 25s.
	Grace time.Duration
	// Stats, when set, counts what Run does and whether it consumes.
	Stats *RunStats
}

// ConsumerConfig is the durable pull consumer of a service.
func (s Spec) ConsumerConfig() jetstream.ConsumerConfig {
	s = s.withDefaults()
	cc := jetstream.ConsumerConfig{
		Durable:       s.Name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.AckWait,
		MaxDeliver:    s.MaxDeliver,
		MaxAckPending: 10000,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if len(s.Filters) == 1 {
		cc.FilterSubject = s.Filters[0]
	} else {
		cc.FilterSubjects = s.Filters
	}
	return cc
}

// Run consumes for spec until ctx is done, then drains: it stops fetching,
// lets in-flight handlers finish (up to Grace, then cancels them so they nak)
// and returns. Nothing in flight is lost: whatever was not acked is
// redelivered.
func (r *Router) Run(ctx context.Context, spec Spec) error {
	spec = spec.withDefaults()
	if spec.Stop != nil {
		defer spec.Stop()
	}
	log := r.logger().With("service", spec.Name)
	cons, err := r.JS.CreateOrUpdateConsumer(ctx, spec.Stream, spec.ConsumerConfig())
	if err != nil {
		return fmt.Errorf("consumer %s: %w", spec.Name, err)
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, spec.Concurrency)
	// The workers free besides the one whose slot was just taken.
	free := func() int { return max(1, cap(slots)-len(slots)+1) }
	next, drain, err := puller(cons, spec, free)
	if err != nil {
		return fmt.Errorf("consume %s: %w", spec.Name, err)
	}
	r.Stats.setRunning(true)
	defer r.Stats.setRunning(false)

	// Handlers outlive ctx by Grace so a shutdown lets them finish.
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			r.Stats.setRunning(false) // no longer taking messages
			drain()
			grace := r.Grace
			if grace <= 0 {
				grace = 25 * time.Second
			}
			select {
			case <-time.After(grace):
				cancelHandlers()
			case <-stopped:
			}
		case <-stopped:
		}
	}()

	beats := newHeartbeats(spec.AckWait / 3)
	defer beats.stop()
	log.Info("service started", "filters", spec.Filters, "concurrency", spec.Concurrency)
	for {
		slots <- struct{}{} // take a message only when a worker is free
		msg, err := next()
		if err != nil {
			<-slots
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				break
			}
			if !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
				log.Warn("fetch failed", "err", err)
				select { // do not spin on a broken connection
				case <-time.After(100 * time.Millisecond):
				case <-ctx.Done():
				}
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			r.handle(hctx, log, spec, beats, msg)
		}()
	}
	wg.Wait()
	close(stopped)
	if ctx.Err() == nil {
		// Nobody asked us to stop: the consumer was deleted or the
		// connection closed for good. Say so instead of idling silently.
		return fmt.Errorf("service %s stopped consuming: the consumer or the connection is gone", spec.Name)
	}
	log.Info("service stopped")
	return nil
}

// puller returns how Run takes messages: from a buffered iterator, or (for
// OnDemand) through pull requests for as many messages as workers are free
// (free) when the request is made. drain stops taking new ones; next then
// returns what was already delivered, then ErrMsgIteratorClosed.
func puller(cons jetstream.Consumer, spec Spec, free func() int) (next func() (jetstream.Msg, error), drain func(), err error) {
	if !spec.OnDemand {
		it, err := cons.Messages(jetstream.PullMaxMessages(spec.Concurrency))
		if err != nil {
			return nil, nil, err
		}
		return func() (jetstream.Msg, error) { return it.Next() }, it.Drain, nil
	}
	stop, cancel := context.WithCancel(context.Background())
	// batch is the open pull request. Run takes a worker's slot before
	// each message, and asks for no more messages than free workers, so
	// every message it delivers has a worker waiting for it. A request
	// ends when it is filled or expires (30s); the next one asks for the
	// workers free then.
	var batch jetstream.MessageBatch
	return func() (jetstream.Msg, error) {
		for {
			if batch == nil {
				if stop.Err() != nil {
					return nil, jetstream.ErrMsgIteratorClosed
				}
				b, err := cons.Fetch(free(), jetstream.FetchContext(stop))
				if err != nil {
					if stop.Err() != nil {
						return nil, jetstream.ErrMsgIteratorClosed
					}
					return nil, err
				}
				batch = b
			}
			// Messages already delivered are handled even after a drain:
			// handing them back would cost them an AckWait.
			if msg, ok := <-batch.Messages(); ok {
				return msg, nil
			}
			err := batch.Error()
			batch = nil
			if stop.Err() != nil {
				return nil, jetstream.ErrMsgIteratorClosed
			}
			if err != nil {
				return nil, err
			}
		}
	}, cancel, nil
}

func (r *Router) logger() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

// handle runs the handler for one message and settles it.
func (r *Router) handle(ctx context.Context, log *slog.Logger, spec Spec, beats *heartbeats, msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil { // not a JetStream message: nothing to settle
		log.Error("message without metadata", "subject", msg.Subject(), "err", err)
		return
	}
	m := &Msg{
		Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data(),
		Seq: md.Sequence.Stream, Delivered: int(md.NumDelivered), Time: md.Timestamp,
	}
	log = log.With("subject", m.Subject, "seq", m.Seq, "delivered", m.Delivered)
	r.Stats.begin()
	defer r.Stats.end()

	start := time.Now()
	stop := beats.add(msg)
	outs, err := call(ctx, spec.Handler, m)
	stop()
	r.Metrics.observe(spec.Name, time.Since(start).Seconds())

	// Publishing must not be cut short by a shutdown: use a fresh deadline.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()

	var dead *DeadError
	switch delay, snoozed := IsSnooze(err); {
	case err == nil:
		for _, out := range outs {
			if perr := r.publish(pctx, spec.Name, out); perr != nil {
				log.Error("publish failed; will retry", "to", out.Subject, "err", perr)
				r.retry(pctx, log, spec, msg, m, perr)
				return
			}
		}
		r.settle(log, msg.Ack(), "ack")
		r.count(spec.Name, "ok")
	case snoozed && m.Delivered >= spec.MaxDeliver:
		// The server would not deliver it again: keep it for a human.
		r.deadLetter(pctx, log, spec, msg, m, events.ReviewPoison, "",
			fmt.Errorf("still snoozed after %d deliveries: %w", m.Delivered, err))
	case snoozed:
		log.Debug("snoozed", "delay", delay, "err", err)
		r.settle(log, msg.NakWithDelay(delay), "nak")
		r.count(spec.Name, "snoozed")
	case errors.As(err, &dead):
		log.Warn("sending to review", "reason", dead.Reason, "err", dead.Err)
		r.deadLetter(pctx, log, spec, msg, m, dead.Reason, dead.Key, dead.Err)
	case ctx.Err() != nil:
		log.Info("shutdown: handing message back", "err", err)
		r.settle(log, msg.Nak(), "nak")
		r.count(spec.Name, "shutdown")
	default:
		r.retry(pctx, log, spec, msg, m, err)
	}
}

// retry naks with the backoff delay, or dead-letters on the last delivery.
func (r *Router) retry(ctx context.Context, log *slog.Logger, spec Spec, msg jetstream.Msg, m *Msg, err error) {
	if m.Delivered >= spec.MaxDeliver {
		log.Error("deliveries exhausted; sending to review", "err", err)
		r.deadLetter(ctx, log, spec, msg, m, events.ReviewPoison, "",
			fmt.Errorf("failed %d deliveries, last error: %w", m.Delivered, err))
		return
	}
	delay := spec.Backoff(m.Delivered)
	log.Warn("handler failed; retrying", "err", err, "delay", delay)
	r.settle(log, msg.NakWithDelay(delay), "nak")
	r.count(spec.Name, "retried")
}

// deadLetter copies the original bytes to dispatch.review.<reason>.<key>
// with the reason in headers, then terminates the message. If the copy
// fails the message is nak'ed instead: it is never dropped.
func (r *Router) deadLetter(ctx context.Context, log *slog.Logger, spec Spec, msg jetstream.Msg, m *Msg, reason, key string, cause error) {
	out := DeadLetter(m, spec.Stream, reason, key, cause)
	if err := r.publish(ctx, spec.Name, out); err != nil {
		log.Error("dead-letter publish failed; retrying later", "err", err)
		r.settle(log, msg.NakWithDelay(spec.Backoff(m.Delivered)), "nak")
		return
	}
	r.settle(log, msg.TermWithReason(reason), "term")
	r.count(spec.Name, "dead")
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
		if len(k) > 9 && k[:9] == "Dispatch-" {
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
		Data:    m.Data,
	}
}

func (r *Router) count(service, result string) {
	r.Metrics.count(service, result)
	r.Stats.settled(result)
}

func (r *Router) publish(ctx context.Context, service string, out Out) error {
	h := out.Header
	if h == nil {
		h = nats.Header{}
	}
	if r.Instance != "" && h.Get(events.HeaderService) == "" {
		h.Set(events.HeaderService, r.Instance)
	}
	ack, err := r.JS.PublishMsg(ctx, &nats.Msg{Subject: out.Subject, Header: h, Data: out.Data}, jetstream.WithMsgID(out.MsgID))
	if err != nil {
		return err
	}
	r.Metrics.published(service, ack.Duplicate)
	return nil
}

func (r *Router) settle(log *slog.Logger, err error, what string) {
	if err != nil {
		// The server redelivers after AckWait: handlers are idempotent.
		log.Warn(what+" failed; the message will be redelivered", "err", err)
	}
}

// call runs h, turning a panic into an error (retried, then poison).
func call(ctx context.Context, h Handler, m *Msg) (outs []Out, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panic: %v", p)
		}
	}()
	return h(ctx, m)
}

// heartbeats tell the server, every interval, that the messages whose
// handlers still run are still being worked on, so a long model call is
// not redelivered to another worker. One goroutine beats for all of a
// service's messages: a message in flight costs an entry in a map, not a
// goroutine and a timer.
type heartbeats struct {
	every time.Duration
	mu    sync.Mutex
	msgs  map[*beat]struct{}
	done  chan struct{}
}

type beat struct {
	msg  jetstream.Msg
	last time.Time
}

func newHeartbeats(every time.Duration) *heartbeats {
	h := &heartbeats{every: every, msgs: map[*beat]struct{}{}, done: make(chan struct{})}
	go h.run()
	return h
}

// run beats, twice per interval, every message not told for an interval:
// each is told at most 1.5 intervals apart.
func (h *heartbeats) run() {
	t := time.NewTicker(h.every / 2)
	defer t.Stop()
	var due []jetstream.Msg
	for {
		select {
		case <-h.done:
			return
		case now := <-t.C:
			due = due[:0]
			h.mu.Lock()
			for b := range h.msgs {
				if now.Sub(b.last) >= h.every {
					b.last = now
					due = append(due, b.msg)
				}
			}
			h.mu.Unlock()
			for _, msg := range due {
				_ = msg.InProgress()
			}
		}
	}
}

// add beats for msg until the returned stop is called.
func (h *heartbeats) add(msg jetstream.Msg) (stop func()) {
	b := &beat{msg: msg, last: time.Now()}
	h.mu.Lock()
	h.msgs[b] = struct{}{}
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		delete(h.msgs, b)
		h.mu.Unlock()
	}
}

func (h *heartbeats) stop() { close(h.done) }
