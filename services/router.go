package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
)

// Handler handles one message: it returns the messages to publish, or an
// error that decides the message's fate (see the package doc).
type Handler func(ctx context.Context, m *Msg) ([]Out, error)

// keepWorkers bounds the workers a router keeps between messages.
const keepWorkers = 32

// FastPrefetch is the Prefetch of a service whose handler makes only NATS
// round trips (intake, gate, prompt builder, recorder): at about a
// millisecond a message, 64 wait well under a second for a worker.
const FastPrefetch = 64

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
	// Prefetch is how many messages one instance keeps pulled ahead of its
	// workers (never fewer than Concurrency). For a handler that takes
	// about a millisecond, a deeper buffer spares a pull request every few
	// messages; each message waiting in it has its AckWait running, so a
	// slow handler keeps the default. Ignored with OnDemand. Default
	// Concurrency.
	Prefetch int
	// MaxDeliver bounds deliveries of one message (naks included); on the last
	// one a failing message goes to dispatch.review.poison. Default 10.
	MaxDeliver int
	// MaxAckPending bounds the messages the consumer has delivered and
	// not yet seen acked, across every instance (a snoozed message counts
	// until it is acked). Default DefaultMaxAckPending.
	MaxAckPending int
	// AckWait is how long a delivered message is ours before the server
	// redelivers it; a heartbeat extends it while the handler runs. Default 30s.
	AckWait time.Duration
	// Timeout is the handler's deadline per message: its context is
	// cancelled then and the message retried like any failure. Default
	// none.
	Timeout time.Duration
	// Middleware wraps Handler inside the router's own (see Router.chain):
	// the first is the outermost. Default none.
	Middleware []Middleware
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
	// DeliverNew makes a consumer created for the first time start at the
	// stream's end instead of its start: for a consumer that reacts to what
	// happens from then on (the webhook service's view of task states),
	// not to the whole history. Default false: every message stored.
	DeliverNew bool
	// Beside, when set, runs while Run consumes (the gate's sweeper of
	// held passes): its context ends when Run returns, and Run waits for
	// it.
	Beside func(ctx context.Context)
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
	if s.MaxAckPending <= 0 {
		s.MaxAckPending = DefaultMaxAckPending
	}
	if s.Backoff == nil {
		s.Backoff = ExpBackoff(time.Second, time.Minute)
	}
	return s
}

// DefaultMaxAckPending is Spec.MaxAckPending when unset.
const DefaultMaxAckPending = 10000

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
	// Tracer, when set, makes a span of every message handled and carries
	// its trace context into the outputs (Tracing). Default none: tracing
	// off.
	Tracer trace.Tracer

	streams sync.Map // name → jetstream.Stream, for storedAs
}

// ConsumerConfig is the durable pull consumer of a service.
func (s Spec) ConsumerConfig() jetstream.ConsumerConfig {
	s = s.withDefaults()
	cc := jetstream.ConsumerConfig{
		Durable:       s.Name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.AckWait,
		MaxDeliver:    s.MaxDeliver,
		MaxAckPending: s.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if s.DeliverNew {
		cc.DeliverPolicy = jetstream.DeliverNewPolicy
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
		if ctx.Err() != nil {
			return nil // stopped before it started: nothing was in flight
		}
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
	if spec.Beside != nil {
		bctx, stopBeside := context.WithCancel(ctx)
		beside := make(chan struct{})
		go func() { defer close(beside); spec.Beside(bctx) }()
		defer func() { stopBeside(); <-beside }()
	}

	// Handlers outlive ctx by Grace so a shutdown lets them finish.
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	stopped := make(chan struct{})
	go r.shutdown(ctx, drain, cancelHandlers, stopped)

	h := r.chain(log, spec)
	log.Info("service started", "filters", spec.Filters, "concurrency", spec.Concurrency)
	// Up to keepWorkers workers live as long as Run: a goroutine per
	// message would grow a fresh stack through the handler's calls every
	// time (copying it as it grows is a few per cent of the mesh's CPU).
	// A message none of them is free for gets a goroutine of its own, so a
	// thousand model calls in flight keep no thousand grown stacks once
	// they are done.
	work := make(chan jetstream.Msg)
	for range min(spec.Concurrency, keepWorkers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for msg := range work {
				r.handle(hctx, log, spec, h, msg)
				<-slots
			}
		}()
	}
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
		if spec.Concurrency <= keepWorkers {
			work <- msg // the slot it took is a kept worker's: idle, or about to be
			continue
		}
		select {
		case work <- msg: // a kept worker was waiting
		default:
			wg.Add(1)
			go func() {
				defer func() { <-slots; wg.Done() }()
				r.handle(hctx, log, spec, h, msg)
			}()
		}
	}
	close(work)
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

// shutdown lets the handlers outlive ctx by Grace (default 25s): once ctx
// ends it stops taking messages (drain), and cancels the handlers
// (cancelHandlers) unless they are all done (stopped) within Grace.
func (r *Router) shutdown(ctx context.Context, drain, cancelHandlers func(), stopped <-chan struct{}) {
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
}

// puller returns how Run takes messages: from a buffered iterator, or (for
// OnDemand) through pull requests for as many messages as workers are free
// (free) when the request is made. drain stops taking new ones; next then
// returns what was already delivered, then ErrMsgIteratorClosed.
func puller(cons jetstream.Consumer, spec Spec, free func() int) (next func() (jetstream.Msg, error), drain func(), err error) {
	if !spec.OnDemand {
		// A consumer deleted while no pull request waits on it gets no
		// "consumer deleted" from the server, only silence: the missing
		// heartbeats are reported (after 2 × 5s), and the consumer looked up.
		it, err := cons.Messages(jetstream.PullMaxMessages(max(spec.Prefetch, spec.Concurrency)),
			jetstream.PullHeartbeat(5*time.Second), jetstream.WithMessagesErrOnMissingHeartbeat(true))
		if err != nil {
			return nil, nil, err
		}
		return func() (jetstream.Msg, error) {
			msg, err := it.Next()
			if err != nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) && consumerGone(context.Background(), cons, err, true) {
				it.Stop()
				return nil, jetstream.ErrMsgIteratorClosed // Run reports it: the consumer is gone
			}
			return msg, err
		}, it.Drain, nil
	}
	stop, cancel := context.WithCancel(context.Background())
	// batch is the open pull request. Run takes a worker's slot before
	// each message, and asks for no more messages than free workers, so
	// every message it delivers has a worker waiting for it. A request
	// ends when it is filled or expires (30s); the next one asks for the
	// workers free then.
	var batch jetstream.MessageBatch
	// failures counts the pull requests in a row that failed: a consumer
	// deleted between two requests leaves them failing with "no
	// responders", which a server that is restarting says too — every
	// tenth, the consumer is looked up.
	failures := 0
	failed := func(err error) error {
		if stop.Err() != nil {
			return jetstream.ErrMsgIteratorClosed
		}
		if failures++; consumerGone(stop, cons, err, failures%10 == 0) {
			return jetstream.ErrMsgIteratorClosed // Run reports it: the consumer is gone
		}
		return err
	}
	return func() (jetstream.Msg, error) {
		for {
			if batch == nil {
				if stop.Err() != nil {
					return nil, jetstream.ErrMsgIteratorClosed
				}
				b, err := cons.Fetch(free(), jetstream.FetchContext(stop))
				if err != nil {
					return nil, failed(err)
				}
				batch = b
			}
			// Messages already delivered are handled even after a drain:
			// handing them back would cost them an AckWait.
			if msg, ok := <-batch.Messages(); ok {
				failures = 0
				return msg, nil
			}
			err := batch.Error()
			batch = nil
			if stop.Err() != nil {
				return nil, jetstream.ErrMsgIteratorClosed
			}
			if errors.Is(err, nats.ErrTimeout) {
				return nil, err // an expired request: ask again
			}
			if err != nil {
				return nil, failed(err)
			}
		}
	}, cancel, nil
}

// consumerGone reports whether a failed pull means the consumer will never
// deliver again: the server said it was deleted, the connection is closed
// for good, or (lookup) the consumer is not found — twice, a few seconds
// apart: a server shutting down its JetStream answers "not found" too.
func consumerGone(ctx context.Context, cons jetstream.Consumer, err error, lookup bool) bool {
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, nats.ErrConnectionClosed) {
		return true
	}
	if !lookup {
		return false
	}
	notFound := func() bool {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, ierr := cons.Info(ictx)
		return errors.Is(ierr, jetstream.ErrConsumerNotFound)
	}
	if !notFound() {
		return false
	}
	select {
	case <-time.After(goneRecheck):
	case <-ctx.Done():
		return false
	}
	return notFound()
}

// goneRecheck is how long after a consumer is first not found it is looked
// up again before its router stops.
const goneRecheck = 3 * time.Second

func (r *Router) logger() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

// chain wraps spec's handler in the router's middleware, from the
// outside in:
//
//	Tracing      the message's span (Router.Tracer): outputs and
//	             dead-letters are published under it
//	Outcomes     counts the Result (dispatch_messages_total, RunStats)
//	Logging      one line per message: debug when handled, else by its fate
//	DeadLetters  turns a failure into a *Fate: nak with a delay, or copy
//	             to dispatch.review.<reason> and terminate
//	publishing   publishes the outputs; a failure is retried like the handler's;
//	             once the last is stored as new, runs what the handler left
//	             to OnStored
//	Latency      the handler's time (dispatch_handler_seconds)
//	Recoverer    a panic becomes a *PanicError carrying the stack
//	Heartbeat    InProgress every AckWait/3 while the handler runs
//	Timeout      the handler's deadline (Spec.Timeout)
//	spec.Middleware..., then spec.Handler
//
// So a handler's outputs are published before its message is acked, a
// panic or a deadline is a failure like any other, and what is counted
// and logged is what the router then does.
func (r *Router) chain(log *slog.Logger, spec Spec) Handler {
	publish := func(ctx context.Context, out Out) error { return r.publish(ctx, spec.Name, out) }
	mws := []Middleware{
		Tracing(r.Tracer, spec.Name),
		Outcomes(r.Metrics, r.Stats, spec.Name),
		Logging(log),
		DeadLetters(spec, publish),
		r.publishing(spec.Name),
		Latency(r.Metrics, spec.Name),
		Recoverer,
		Heartbeat(spec.AckWait / 3),
		Timeout(spec.Timeout),
	}
	return Chain(spec.Handler, append(mws, spec.Middleware...)...)
}

// handle runs the chain for one message and settles it as its fate says.
// A message that another consumer delivered to this service's inbox is
// not the service's input and is left alone: whoever may create a
// consumer may name any deliver subject (nats-server#8274).
func (r *Router) handle(ctx context.Context, log *slog.Logger, spec Spec, h Handler, msg jetstream.Msg) {
	service := spec.Name
	md, err := msg.Metadata()
	if err != nil { // not a JetStream message: nothing to settle
		log.Error("message without metadata", "subject", msg.Subject(), "err", err)
		return
	}
	if md.Stream != spec.Stream || md.Consumer != spec.Name {
		r.Metrics.foreign(service)
		log.Warn("message delivered by another consumer ignored", "subject", msg.Subject(),
			"stream", md.Stream, "consumer", md.Consumer)
		return
	}
	m := &Msg{
		Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data(),
		Seq: md.Sequence.Stream, Delivered: int(md.NumDelivered), Time: md.Timestamp,
		InProgress: msg.InProgress,
	}
	r.Metrics.received(service, m.Delivered)
	r.Stats.begin()
	defer r.Stats.end()

	_, err = h(ctx, m)
	f := FateOf(err)
	switch f.Action {
	case ActionAck:
		err = msg.Ack()
	case ActionTerm:
		err = msg.TermWithReason(f.Reason)
	case ActionNak:
		if f.Delay > 0 {
			err = msg.NakWithDelay(f.Delay)
		} else {
			err = msg.Nak()
		}
	}
	if err != nil {
		// The server redelivers after AckWait: handlers are idempotent.
		log.Warn(string(f.Action)+" failed; the message will be redelivered",
			"subject", m.Subject, "seq", m.Seq, "delivered", m.Delivered, "err", err)
	}
}

// publishTimeout bounds publishing a message's outputs, or its dead-letter
// record. It is not cut short by a shutdown.
const publishTimeout = 10 * time.Second

// publishing publishes next's outputs before the message is settled: the
// ones before the last together (what a recorded attempt adds to its type's
// trust and spend), then — once every one of them is stored — the last, which
// moves the task on, with any marked Out.WithLast. So whatever reacts to
// the last output finds the others stored. A failure is a *publishError.
func (r *Router) publishing(service string) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			ctx, stored := withStoredHooks(ctx)
			outs, err := next(ctx, m)
			if err != nil || len(outs) == 0 {
				return outs, err
			}
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
			defer cancel()
			first, last := splitLast(outs)
			if _, err := r.publishTogether(pctx, service, first); err != nil {
				return nil, err
			}
			dup, err := r.publishTogether(pctx, service, last)
			if err != nil {
				return nil, err
			}
			if !dup { // what the handler decided is stored now, and only now (OnStored)
				stored.run()
			}
			return outs, nil
		}
	}
}

// splitLast splits a handler's outputs (at least one) into those stored
// before the last is sent and those sent together with it: the last one,
// after the outputs marked Out.WithLast. Without such a mark (nearly every
// message) it only reslices.
func splitLast(outs []Out) (first, last []Out) {
	first, last = outs[:len(outs)-1], outs[len(outs)-1:]
	if !slices.ContainsFunc(first, func(o Out) bool { return o.WithLast }) {
		return first, last
	}
	var before, with []Out
	for _, out := range first {
		if out.WithLast {
			with = append(with, out)
		} else {
			before = append(before, out)
		}
	}
	return before, append(with, last...)
}

// publishTogether publishes outs without waiting for each one's ack before
// sending the next, and returns once all are stored, with whether the
// stream deduplicated the last one (a republish of a message it already
// stores under that Msg-Id).
func (r *Router) publishTogether(ctx context.Context, service string, outs []Out) (lastDup bool, err error) {
	if len(outs) == 1 {
		dup, err := r.publishAck(ctx, service, outs[0])
		if err != nil {
			return false, &publishError{subject: outs[0].Subject, err: err}
		}
		return dup, nil
	}
	acks := make([]jetstream.PubAckFuture, len(outs))
	for i, out := range outs {
		f, err := r.JS.PublishMsgAsync(r.msg(ctx, out), jetstream.WithMsgID(out.MsgID))
		if err != nil {
			return false, &publishError{subject: out.Subject, err: err}
		}
		acks[i] = f
	}
	for i, f := range acks {
		select {
		case ack := <-f.Ok():
			r.Metrics.published(service, ack.Duplicate)
			if ack.Duplicate {
				if err := r.storedAs(ctx, outs[i], ack); err != nil {
					return false, &publishError{subject: outs[i].Subject, err: err}
				}
			}
			lastDup = ack.Duplicate
		case err := <-f.Err():
			return false, &publishError{subject: outs[i].Subject, err: err}
		case <-ctx.Done():
			return false, &publishError{subject: outs[i].Subject, err: ctx.Err()}
		}
	}
	return lastDup, nil
}

// publishError is a failure to publish a handler's output. It is retried
// with backoff, as a handler's error, even at shutdown.
type publishError struct {
	subject string
	err     error
}

func (e *publishError) Error() string { return fmt.Sprintf("publish to %s: %v", e.subject, e.err) }
func (e *publishError) Unwrap() error { return e.err }

func (r *Router) publish(ctx context.Context, service string, out Out) error {
	_, err := r.publishAck(ctx, service, out)
	return err
}

// publishAck publishes out and reports whether the stream deduplicated it
// (a republish of a message it already stores under out's Msg-Id).
func (r *Router) publishAck(ctx context.Context, service string, out Out) (duplicate bool, err error) {
	ack, err := r.JS.PublishMsg(ctx, r.msg(ctx, out), jetstream.WithMsgID(out.MsgID))
	if err != nil {
		return false, err
	}
	r.Metrics.published(service, ack.Duplicate)
	if ack.Duplicate {
		if err := r.storedAs(ctx, out, ack); err != nil {
			return false, err
		}
	}
	return ack.Duplicate, nil
}

// ErrDuplicateMismatch is a publish the stream answered as a duplicate of
// a message that is not the one published: another message holds its
// Msg-Id. The output is not stored, so its input is not acked.
var ErrDuplicateMismatch = errors.New("the stream holds another message under this Msg-Id")

// storedAs checks that the message the stream answered a publish of out
// with, as a duplicate, is out's: stored on out's subject under out's
// Msg-Id. Only a redelivered input republishes, so this read is rare.
func (r *Router) storedAs(ctx context.Context, out Out, ack *jetstream.PubAck) error {
	stream, err := r.stream(ctx, ack.Stream)
	if err != nil {
		return fmt.Errorf("check duplicate %s: %w", out.MsgID, err)
	}
	raw, err := stream.GetMsg(ctx, ack.Sequence)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// The original left the stream (a per-subject limit, the outcome
		// stream's, evicted it) while the server still remembers its
		// Msg-Id. The router publishes only to streams no client may
		// publish to, so it was this output, stored before.
		return nil
	}
	if err != nil {
		return fmt.Errorf("check duplicate %s at %s#%d: %w", out.MsgID, ack.Stream, ack.Sequence, err)
	}
	if raw.Subject != out.Subject || raw.Header.Get(jetstream.MsgIDHeader) != out.MsgID {
		return fmt.Errorf("%w: %s#%d is %q on %s, not %q on %s", ErrDuplicateMismatch, ack.Stream, ack.Sequence,
			raw.Header.Get(jetstream.MsgIDHeader), raw.Subject, out.MsgID, out.Subject)
	}
	return nil
}

// stream is the named stream, bound once.
func (r *Router) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if s, ok := r.streams.Load(name); ok {
		return s.(jetstream.Stream), nil
	}
	s, err := r.JS.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	r.streams.Store(name, s)
	return s, nil
}

// msg is out as a NATS message, naming this instance and carrying ctx's
// trace context (traceparent) when the message is traced.
func (r *Router) msg(ctx context.Context, out Out) *nats.Msg {
	m := NatsMsg(out)
	if r.Tracer != nil {
		tracing.Inject(ctx, m.Header)
	}
	if r.Instance != "" && m.Header.Get(events.HeaderService) == "" {
		m.Header.Set(events.HeaderService, r.Instance)
	}
	return m
}
