// Package follow reads a JetStream stream, or the keys of a KV bucket, in
// order, and takes only what the server delivered from the reader's own
// consumer.
//
// Why: whoever may create a consumer may give it any DeliverSubject, and
// the server delivers there without checking the creator's publish
// permissions (nats-io/nats-server#8274). Inboxes are listed on the
// monitoring port (/connz?subs=1), so a hostile user can have stored
// messages of its choice delivered into another process's watcher.
// nats.go's KV watcher and ordered consumers take any message on their
// inbox: the KV watcher passes it on as an entry (its key is the subject
// minus the "$KV.<bucket>." prefix, unchecked; its revision the stream
// sequence of the attacker's stream), and both take its stream sequence
// as their position, so the consumer they re-create after the next real
// message (a sequence gap, to them) starts past every real update.
//
// A Follower names each consumer it creates itself, at random, before
// creating it, so every delivery is checked against the reply subject the
// server sets ($JS.ACK.<stream>.<consumer>.…): the stream, the consumer,
// the subject (one of the filters) and the delivery sequence. A delivery
// that fails is logged at warn (ForgedDelivery, with the stream, consumer
// and subject it claims), counted (Forged) and dropped before anything
// else looks at it: it moves no position and reaches no handler. Watch
// adds a re-read: every entry it passes on is read back from the bucket by
// its revision, so what it passes on is what the bucket holds.
package follow

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ForgedDelivery is the message logged (at warn) for a delivery a
// Follower drops because its own consumer did not send it.
const ForgedDelivery = "forged delivery ignored: not from this follower's consumer"

// DefaultHeartbeat is the consumer's idle heartbeat when Config.Heartbeat
// is zero.
const DefaultHeartbeat = 5 * time.Second

// Config says what a Follower follows.
type Config struct {
	// Stream is the stream followed. Required.
	Stream string
	// Filters are the subjects followed (wildcards allowed). Default: every
	// subject of the stream.
	Filters []string
	// DeliverPolicy is where following starts: jetstream.DeliverAllPolicy
	// (the zero value), DeliverLastPerSubjectPolicy or DeliverNewPolicy.
	DeliverPolicy jetstream.DeliverPolicy
	// After, when set, starts following after this stream sequence
	// instead (DeliverPolicy is then ignored).
	After uint64
	// FlowControl has the server pause until the follower has taken what
	// it sent; the follower answers on $JS.FC.<Stream>.<consumer>.…, which
	// its user must be allowed to publish. Default off: the client buffers.
	FlowControl bool
	// Heartbeat is the consumer's idle heartbeat; when nothing arrives for
	// three of them the consumer is replaced. Default DefaultHeartbeat.
	Heartbeat time.Duration
	// CaughtUp, when set, is called once, on the goroutine that calls fn,
	// when every message the stream held for the filters when following
	// started has been passed to fn (at once when there was none).
	CaughtUp func()
	// Log receives forged deliveries (warn) and consumer replacements.
	// Default slog.Default().
	Log *slog.Logger
}

// Msg is one message the follower's consumer delivered.
type Msg struct {
	Subject string
	Header  nats.Header
	Data    []byte
	// Seq is its sequence in the stream.
	Seq uint64
	// Pending is how many messages the consumer had left to deliver after
	// this one.
	Pending uint64
	// Time is when the stream stored it.
	Time time.Time
}

// Follower follows a stream through a push consumer it creates (AckNone,
// in memory, one replica), re-creating it after the last message it passed
// on when a delivery is missing, the heartbeats stop or the connection
// reconnects. The handler runs on one goroutine, in stream order.
type Follower struct {
	js  jetstream.JetStream
	nc  *nats.Conn
	cfg Config
	fn  func(Msg)
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	in     chan *nats.Msg
	forged atomic.Uint64

	// Owned by the following goroutine (and Stream before it starts).
	prefix       string // of every consumer name of this follower
	serial       int
	name         string // the current consumer
	sub          *nats.Subscription
	dseq, sseq   uint64 // the last delivery passed on: its consumer and stream sequences
	caught       bool
	initial      uint64 // messages pending when following started
	passed       uint64
	reconnected  chan nats.Status
	idleDeadline time.Duration
}

// Stream follows cfg.Stream: fn is called with each message of the filters,
// in order, from the start cfg.DeliverPolicy says, until ctx ends or Stop is
// called. It returns once the first consumer exists.
func Stream(ctx context.Context, js jetstream.JetStream, cfg Config, fn func(Msg)) (*Follower, error) {
	if cfg.Stream == "" {
		return nil, errors.New("follow: no stream")
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	f := &Follower{
		js: js, nc: js.Conn(), cfg: cfg, fn: fn, log: log.With("stream", cfg.Stream),
		done: make(chan struct{}), in: make(chan *nats.Msg),
		prefix: "follow_" + rand.Text()[:12], idleDeadline: 3 * cfg.Heartbeat,
		sseq: cfg.After,
	}
	f.ctx, f.cancel = context.WithCancel(ctx)
	info, err := f.open(ctx)
	if err != nil {
		f.cancel()
		return nil, fmt.Errorf("follow %s: %w", cfg.Stream, err)
	}
	f.initial = info.NumPending
	if f.initial == 0 {
		f.caughtUp()
	}
	f.reconnected = f.nc.StatusChanged(nats.CONNECTED)
	go f.run()
	return f, nil
}

// Stop stops following; the consumer is deleted. It does not wait for a
// handler call in progress (see Done).
func (f *Follower) Stop() { f.cancel() }

// Done is closed when the follower has stopped: after Stop, when the
// context of Stream ended, or when the connection closed. fn is not
// called after that.
func (f *Follower) Done() <-chan struct{} { return f.done }

// Forged is how many deliveries the follower dropped because its own
// consumer did not send them.
func (f *Follower) Forged() uint64 { return f.forged.Load() }

func (f *Follower) run() {
	defer close(f.done)
	defer f.nc.RemoveStatusListener(f.reconnected)
	defer f.close()
	idle := time.NewTimer(f.idleDeadline)
	defer idle.Stop()
	for {
		select {
		case <-f.ctx.Done():
			return
		case m := <-f.in:
			if f.take(m) {
				idle.Reset(f.idleDeadline)
			}
		case <-idle.C:
			alive := false
			select {
			case m := <-f.in: // it came while the handler was busy
				alive = f.take(m)
			default:
			}
			if !alive {
				f.replace("no message or heartbeat for " + f.idleDeadline.String())
			}
			idle.Reset(f.idleDeadline)
		case <-f.reconnected:
			f.replace("reconnected")
			idle.Reset(f.idleDeadline)
		}
		if f.nc.IsClosed() {
			return
		}
	}
}

// take handles one message of the inbox and reports whether it is a sign
// of life (a delivery of the current consumer, or a heartbeat).
func (f *Follower) take(m *nats.Msg) bool {
	// The server's heartbeats and flow control requests carry no
	// JetStream reply; a stored message with a Status header does.
	if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 && (m.Reply == "" || strings.HasPrefix(m.Reply, "$JS.FC.")) {
		return f.control(m, status)
	}
	meta, err := m.Metadata()
	if err != nil {
		f.reject(m, "", "", "no JetStream reply subject")
		return false
	}
	if meta.Stream != f.cfg.Stream || meta.Consumer != f.name {
		if meta.Stream == f.cfg.Stream && strings.HasPrefix(meta.Consumer, f.prefix+"_") {
			return false // still in flight from a consumer this follower replaced
		}
		f.reject(m, meta.Stream, meta.Consumer, "another stream or consumer")
		return false
	}
	if !f.filtered(m.Subject) {
		f.reject(m, meta.Stream, meta.Consumer, "a subject outside the filters")
		return false
	}
	if meta.Sequence.Stream <= f.sseq {
		// A follower's stream positions only go forward: an older message
		// under this consumer's name is a consumer re-created by someone
		// else to replay old messages.
		f.reject(m, meta.Stream, meta.Consumer, "a stream position already passed")
		return false
	}
	if meta.Sequence.Consumer != f.dseq+1 {
		f.replace(fmt.Sprintf("delivery %d after %d", meta.Sequence.Consumer, f.dseq))
		return true
	}
	f.dseq, f.sseq = meta.Sequence.Consumer, meta.Sequence.Stream
	f.fn(Msg{Subject: m.Subject, Header: m.Header, Data: m.Data, Seq: meta.Sequence.Stream, Pending: meta.NumPending, Time: meta.Timestamp})
	f.passed++
	if !f.caught && (f.passed >= f.initial || meta.NumPending == 0) {
		f.caughtUp()
	}
	return true
}

// control handles a status message: an idle heartbeat (which cannot be
// told from another consumer's: it names no consumer) or a flow control
// request, answered only when the current consumer sent it.
func (f *Follower) control(m *nats.Msg, status string) bool {
	if status != "100" {
		f.log.Debug("status message ignored", "status", status, "description", m.Header.Get("Description"))
		return false
	}
	fc := m.Reply // a flow control request
	if fc == "" {
		fc = m.Header.Get("Nats-Consumer-Stalled") // a heartbeat of a consumer waiting for an answer
	}
	if fc == "" {
		// An idle heartbeat names the last delivery of the consumer that
		// sent it: one of another consumer (aimed at this inbox) is no sign
		// of life, so it cannot keep a deleted consumer from being
		// replaced.
		if last := m.Header.Get("Nats-Last-Consumer"); last != "" && last != strconv.FormatUint(f.dseq, 10) {
			return false
		}
		return true
	}
	if stream, consumer := flowControlOf(fc); stream != f.cfg.Stream || consumer != f.name {
		if stream != f.cfg.Stream || !strings.HasPrefix(consumer, f.prefix+"_") {
			f.reject(m, stream, consumer, "flow control of another stream or consumer")
		}
		return false
	}
	if err := f.nc.Publish(fc, nil); err != nil {
		f.log.Warn("flow control answer", "err", err)
	}
	return true
}

// flowControlOf is the stream and consumer a flow control subject names:
// $JS.FC.<stream>.<consumer>.<id>, or with the domain and account hash
// first ($JS.FC.<domain>.<hash>.<stream>.<consumer>.<id>).
func flowControlOf(subject string) (stream, consumer string) {
	t := strings.Split(subject, ".")
	switch {
	case len(t) == 5 && t[0] == "$JS" && t[1] == "FC":
		return t[2], t[3]
	case len(t) == 7 && t[0] == "$JS" && t[1] == "FC":
		return t[4], t[5]
	}
	return "", ""
}

func (f *Follower) reject(m *nats.Msg, stream, consumer, why string) {
	f.forged.Add(1)
	f.log.Warn(ForgedDelivery, "claimed_stream", stream, "claimed_consumer", consumer,
		"subject", m.Subject, "reply", m.Reply, "why", why)
}

func (f *Follower) caughtUp() {
	f.caught = true
	if f.cfg.CaughtUp != nil {
		f.cfg.CaughtUp()
	}
}

// filtered reports whether subject is one the follower asked for.
func (f *Follower) filtered(subject string) bool {
	if len(f.cfg.Filters) == 0 {
		return true
	}
	for _, filter := range f.cfg.Filters {
		if SubjectMatches(subject, filter) {
			return true
		}
	}
	return false
}

// SubjectMatches reports whether subject matches filter, which may hold
// the wildcards * (one token) and > (the rest, at least one token).
func SubjectMatches(subject, filter string) bool {
	st, ft := strings.Split(subject, "."), strings.Split(filter, ".")
	for i, f := range ft {
		if f == ">" {
			return i == len(ft)-1 && len(st) > i
		}
		if i >= len(st) || (f != "*" && f != st[i]) || st[i] == "" {
			return false
		}
	}
	return len(st) == len(ft)
}

// open subscribes a new inbox and creates a consumer, named before it
// exists, delivering to it: after the last message passed on, or from the
// configured start when none was.
func (f *Follower) open(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	f.serial++
	f.name = fmt.Sprintf("%s_%d", f.prefix, f.serial)
	f.dseq = 0
	inbox := f.nc.NewInbox()
	sub, err := f.nc.Subscribe(inbox, func(m *nats.Msg) {
		select {
		case f.in <- m:
		case <-f.ctx.Done():
		}
	})
	if err != nil {
		return nil, err
	}
	cfg := jetstream.ConsumerConfig{
		Name:              f.name,
		DeliverSubject:    inbox,
		FilterSubjects:    f.cfg.Filters, // never in the API subject: a filter may hold wildcards
		DeliverPolicy:     f.cfg.DeliverPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		MaxDeliver:        1,
		FlowControl:       f.cfg.FlowControl,
		IdleHeartbeat:     f.cfg.Heartbeat,
		InactiveThreshold: 5 * time.Minute,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if f.sseq > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, f.sseq+1
	}
	cons, err := f.js.CreatePushConsumer(ctx, f.cfg.Stream, cfg)
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	f.sub = sub
	return cons.CachedInfo(), nil
}

// replace drops the current consumer and creates another one after the
// last message passed on, trying again until it exists or following stops.
func (f *Follower) replace(why string) {
	f.log.Debug("replacing the consumer", "consumer", f.name, "why", why, "after", f.sseq)
	f.close()
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		if f.ctx.Err() != nil || f.nc.IsClosed() {
			return
		}
		_, err := f.open(f.ctx)
		if err == nil {
			return
		}
		f.log.Warn("following: creating a consumer", "err", err, "retry_in", wait)
		select {
		case <-f.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// close unsubscribes the current inbox and deletes its consumer (best
// effort: an idle consumer goes away after its InactiveThreshold anyway).
func (f *Follower) close() {
	if f.sub == nil {
		return
	}
	_ = f.sub.Unsubscribe()
	f.sub = nil
	if f.nc.IsClosed() {
		return
	}
	name := f.name
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = f.js.DeleteConsumer(ctx, f.cfg.Stream, name)
	}()
}
