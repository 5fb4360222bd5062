package follow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// WatchOptions are Watch's options. The zero value passes on the current
// value of each key, the nil marker, then every change, deletes included.
type WatchOptions struct {
	// IgnoreDeletes leaves deletes and purges out (jetstream.IgnoreDeletes).
	IgnoreDeletes bool
	// UpdatesOnly passes on only what changes after the watch starts, with
	// no nil marker (jetstream.UpdatesOnly).
	UpdatesOnly bool
	// IncludeHistory passes on every revision the bucket holds, not only
	// the newest of each key, before the nil marker
	// (jetstream.IncludeHistory).
	IncludeHistory bool
	// Log receives forged deliveries (warn). Default slog.Default().
	Log *slog.Logger
}

// Watcher is a KV watch whose entries are read back from the bucket: a
// jetstream.KeyWatcher.
type Watcher struct {
	f       *Follower
	stop    context.CancelFunc // of the watch's context: also ends a send to updates or a read in progress
	updates chan jetstream.KeyValueEntry
}

// Updates are the entries: the current values (unless UpdatesOnly), a nil
// marker, then each change. Closed when the watch stops.
func (w *Watcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }

// Stop stops the watch; Updates is closed.
func (w *Watcher) Stop() error {
	w.stop()
	return nil
}

// Forged is how many deliveries the watch dropped (Follower.Forged).
func (w *Watcher) Forged() uint64 { return w.f.Forged() }

var _ jetstream.KeyWatcher = (*Watcher)(nil)

// WatchAll watches every key of kv (Watch).
func WatchAll(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, o WatchOptions) (*Watcher, error) {
	return Watch(ctx, js, kv, ">", o)
}

// Watch watches the keys of kv that match key (which may hold the
// wildcards * and >) as kv.Watch does, until ctx ends or Stop is called,
// through a Follower of the bucket's stream (KV_<bucket>) on js, with flow
// control. Each delivery that passes the Follower's checks is read back
// from the bucket by its revision (a direct get) and the entry passed on is
// the one read — its key, value, revision and operation — never the
// delivered bytes; one the bucket no longer holds (a newer revision
// replaced it) is left out. js's user needs the permissions of a
// nats.go KV watch plus Get: $JS.API.STREAM.INFO.KV_<b>,
// $JS.API.DIRECT.GET.KV_<b> and .KV_<b>.>, $JS.API.CONSUMER.CREATE.KV_<b>.>,
// $JS.API.CONSUMER.DELETE.KV_<b>.>, $JS.FC.KV_<b>.>.
func Watch(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, o WatchOptions) (*Watcher, error) {
	if !validSearchKey(key) {
		return nil, fmt.Errorf("follow: watch %s: %w: %q", kv.Bucket(), jetstream.ErrInvalidKey, key)
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	bucket := kv.Bucket()
	stream, err := js.Stream(ctx, events.KVStream(bucket))
	if err != nil {
		return nil, fmt.Errorf("follow: watch %s: %w", bucket, err)
	}
	r := &reader{stream: stream, bucket: bucket, pre: "$KV." + bucket + ".", log: log.With("bucket", bucket)}
	wctx, cancel := context.WithCancel(ctx)
	w := &Watcher{stop: cancel, updates: make(chan jetstream.KeyValueEntry, 256)}
	send := func(e jetstream.KeyValueEntry) {
		select {
		case w.updates <- e:
		case <-wctx.Done():
		}
	}
	cfg := Config{
		Stream:        events.KVStream(bucket),
		Filters:       []string{r.pre + key},
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		FlowControl:   true,
		Log:           log,
	}
	if o.IncludeHistory {
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	if o.UpdatesOnly {
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	} else {
		cfg.CaughtUp = func() { send(nil) }
	}
	w.f, err = Stream(wctx, js, cfg, func(m Msg) {
		e := r.read(wctx, m)
		if e == nil || (o.IgnoreDeletes && e.op != jetstream.KeyValuePut) {
			return
		}
		send(e)
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("follow: watch %s: %w", bucket, err)
	}
	go func() {
		<-w.f.Done()
		cancel()
		close(w.updates)
	}()
	return w, nil
}

// History returns every revision of key (a pattern: every revision of
// each matching key) the bucket holds, oldest first, as kv.History does,
// read through a watch (Watch with IncludeHistory) that stops at the nil
// marker. jetstream.ErrKeyNotFound when there is none.
func History(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, log *slog.Logger) ([]jetstream.KeyValueEntry, error) {
	w, err := Watch(ctx, js, kv, key, WatchOptions{IncludeHistory: true, Log: log})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var all []jetstream.KeyValueEntry
	for e := range w.Updates() {
		if e == nil {
			if len(all) == 0 {
				return nil, jetstream.ErrKeyNotFound
			}
			return all, nil
		}
		all = append(all, e)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("follow: history of %s %s: the watch ended before the nil marker", kv.Bucket(), key)
}

// reader reads back what a bucket's follower delivered.
type reader struct {
	stream jetstream.Stream
	bucket string
	pre    string // $KV.<bucket>.
	log    *slog.Logger
}

// read returns the entry the bucket holds at m's revision, or nil when
// there is none to pass on. It tries again while the bucket cannot be
// read (each failure logged) until ctx ends.
func (r *reader) read(ctx context.Context, m Msg) *entry {
	key, ok := strings.CutPrefix(m.Subject, r.pre)
	if !ok || !validKey(key) {
		r.log.Warn(ForgedDelivery, "subject", m.Subject, "why", "not a key of the bucket")
		return nil
	}
	missing := 0
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		raw, err := r.stream.GetMsg(ctx, m.Seq)
		switch {
		case err == nil && raw.Subject == m.Subject:
			return &entry{bucket: r.bucket, key: key, value: raw.Data, rev: raw.Sequence,
				created: raw.Time, delta: m.Pending, op: operation(raw.Header)}
		case err == nil:
			r.log.Warn(ForgedDelivery, "subject", m.Subject, "rev", m.Seq, "why", "the bucket holds "+raw.Subject+" at this revision")
			return nil
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// Replaced by a newer revision (that one follows), or not yet
			// on the replica that answered.
			last, lerr := r.stream.GetLastMsgForSubject(ctx, m.Subject)
			if lerr == nil && last.Sequence > m.Seq {
				return nil
			}
			if missing++; missing > 8 {
				r.log.Warn("watched revision no longer in the bucket: left out", "key", key, "rev", m.Seq)
				return nil
			}
		case ctx.Err() != nil:
			return nil
		default:
			r.log.Warn("reading a watched revision back", "key", key, "rev", m.Seq, "err", err, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// Operation is what a stored KV message does (put, delete, purge), from
// its headers as nats.go reads them: for a Stream of a bucket's stream.
func Operation(h nats.Header) jetstream.KeyValueOp { return operation(h) }

// operation is what a stored KV message does, from its headers (as
// nats.go reads them).
func operation(h nats.Header) jetstream.KeyValueOp {
	switch h.Get("KV-Operation") {
	case "DEL":
		return jetstream.KeyValueDelete
	case "PURGE":
		return jetstream.KeyValuePurge
	}
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge":
		return jetstream.KeyValuePurge
	case "Remove":
		return jetstream.KeyValueDelete
	}
	return jetstream.KeyValuePut
}

var (
	keyRe       = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)
	searchKeyRe = regexp.MustCompile(`^[-/_=.a-zA-Z0-9*]*[>]?$`)
)

// validKey is nats.go's rule for a key; validSearchKey for a watched
// pattern.
func validKey(key string) bool { return plainDots(key) && keyRe.MatchString(key) }

func validSearchKey(key string) bool { return plainDots(key) && searchKeyRe.MatchString(key) }

func plainDots(key string) bool {
	return key != "" && key[0] != '.' && key[len(key)-1] != '.' && !strings.Contains(key, "..")
}

// entry is a jetstream.KeyValueEntry read back from the bucket.
type entry struct {
	bucket, key string
	value       []byte
	rev, delta  uint64
	created     time.Time
	op          jetstream.KeyValueOp
}

func (e *entry) Bucket() string                  { return e.bucket }
func (e *entry) Key() string                     { return e.key }
func (e *entry) Value() []byte                   { return e.value }
func (e *entry) Revision() uint64                { return e.rev }
func (e *entry) Created() time.Time              { return e.created }
func (e *entry) Delta() uint64                   { return e.delta }
func (e *entry) Operation() jetstream.KeyValueOp { return e.op }
