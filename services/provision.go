package services

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// StreamConfig sizes what Provision creates.
type StreamConfig struct {
	// MaxAge is how long events are kept: the audit horizon. Default 30 days.
	MaxAge time.Duration
	// Duplicates is the Nats-Msg-Id deduplication window. It must exceed the
	// longest a message can take to be redelivered and republished (deliveries
	// × (backoff cap + AckWait), transient snoozes included). Default 2h.
	Duplicates time.Duration
	// SubmitDuplicates is SubmitStream's Nats-Msg-Id deduplication window,
	// for a client's retried publish; intake makes one task per id for as
	// long as the task is kept anyway. Default 2m.
	SubmitDuplicates time.Duration
	// Replicas for the stream and buckets: 1 on a single node, 3 in a cluster.
	// Default 1.
	Replicas int
	// HistoryKeep is how many revisions of a task state the bucket keeps.
	// Default 5.
	HistoryKeep int
	// MaxBytes bounds Stream, SubmitMaxBytes SubmitStream, so that what
	// clients send cannot take the account's whole store from the KV
	// buckets. A full stream refuses new messages (DiscardNew): a client's
	// submission fails, a service's output is retried, and nothing stored
	// — a task's pending event, a submission intake has not read — is ever
	// dropped for room; messages leave at MaxAge. Each is reserved against
	// the account's max_file when the stream is made. Default unlimited.
	MaxBytes, SubmitMaxBytes int64
}

// MaxEventSize is the largest message Stream and SubmitStream store: the
// server's default max_payload. A submission is checked far below it
// (events.MaxSubmitBytes); a review record keeps at most MaxKeptBody of
// what it records, so that it always fits.
const MaxEventSize = 1 << 20

func (c StreamConfig) withDefaults() StreamConfig {
	if c.MaxAge <= 0 {
		c.MaxAge = 30 * 24 * time.Hour
	}
	if c.Duplicates <= 0 {
		c.Duplicates = 2 * time.Hour
	}
	c.Duplicates = min(c.Duplicates, c.MaxAge)
	if c.SubmitDuplicates <= 0 {
		c.SubmitDuplicates = 2 * time.Minute
	}
	c.SubmitDuplicates = min(c.SubmitDuplicates, c.MaxAge)
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.HistoryKeep <= 0 {
		c.HistoryKeep = 5
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = -1
	}
	if c.SubmitMaxBytes <= 0 {
		c.SubmitMaxBytes = -1
	}
	return c
}

// Stores are the KV buckets the services use; one a process did not bind is nil.
type Stores struct {
	Tasks, Trust, History, Policy, Held, Models jetstream.KeyValue
}

// PolicyRevisions is how many revisions of the policy BucketPolicy keeps:
// every task event names the revision it was decided under, and dispatch
// rebuild reads it back. KV history stops at 64, so the bucket's stream is
// made by hand with the KV layout and this per-subject limit; it has no
// MaxAge (the policy in force must never expire).
const PolicyRevisions = 100_000

// StreamSubjects are the subjects kept on Stream: every task event, review
// record, task index entry (dispatch.index.>) and webhook delivery
// (dispatch.webhook.>). Only services publish
// them. dispatch.api.> (request-reply) is deliberately not among them: the
// stream would answer requests.
var StreamSubjects = []string{events.TaskRoot + ".>", events.ReviewFilter, events.IndexFilter, events.WebhookFilter}

// SubmitSubjects are the subjects kept on SubmitStream: every submission,
// bare dispatch.submit too, so a message there is rejected, not lost.
var SubmitSubjects = events.SubmitFilters

// CounterSubjects are the subjects of CounterStream (trust.SpendRoot).
const CounterSubjects = "dispatch.count.>"

// AdvisorySubjects capture the max-delivery advisories of the consumers of
// Stream and SubmitStream.
var AdvisorySubjects = []string{
	"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + Stream + ".>",
	"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + SubmitStream + ".>",
}

// discard is the discard policy of a stream of maxBytes: a bounded one
// refuses new messages rather than drop stored ones (an unbounded one
// reaches no limit it would apply to).
func discard(maxBytes int64) jetstream.DiscardPolicy {
	if maxBytes > 0 {
		return jetstream.DiscardNew
	}
	return jetstream.DiscardOld
}

// Provision creates or updates the stream, the advisory stream and the KV
// buckets. It is idempotent: every service may call it at start.
func Provision(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (*Stores, error) {
	cfg = cfg.withDefaults()
	if err := provisionStreams(ctx, js, cfg); err != nil {
		return nil, err
	}
	if err := provisionPolicyBucket(ctx, js, cfg); err != nil {
		return nil, err
	}
	var st Stores
	for _, b := range []struct {
		kv      *jetstream.KeyValue
		name    string
		history int
		ttl     time.Duration
	}{
		// A key not written for MaxAge expires: a task, a type's gate
		// facts, a (type, subject)'s history — clients choose types and
		// subjects, so nothing of theirs stays for ever.
		{&st.Tasks, BucketTasks, cfg.HistoryKeep, cfg.MaxAge},
		{&st.Trust, BucketTrust, 1, cfg.MaxAge},
		{&st.History, BucketHistory, 1, cfg.MaxAge},
		// An entry lives while its pass is held: no age removes it (a
		// hold time past MaxAge would strand its pass); its look does.
		{&st.Held, BucketHeld, 1, 0},
		// One key per model of the policy's chains (a known set), each
		// entry ending by its own time (a cool-down's, a mark's).
		{&st.Models, BucketModels, 1, 0},
	} {
		kc := jetstream.KeyValueConfig{
			Bucket: b.name, History: uint8(b.history), TTL: b.ttl,
			Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		}
		if b.name == BucketHeld { // removed entries leave no marker for long (HeldIndex.Delete)
			kc.LimitMarkerTTL = HeldMarkerTTL
		}
		kv, err := ensureBucket(ctx, js, kc)
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", b.name, err)
		}
		*b.kv = kv
	}
	var err error
	if st.Policy, err = js.KeyValue(ctx, BucketPolicy); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", BucketPolicy, err)
	}
	return &st, nil
}

// provisionStreams creates or updates the streams: the task events', the
// submissions', the advisories', the spend counters' and the outcomes'.
func provisionStreams(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) error {
	_, err := ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        Stream,
		Description: "dispatchmesh: every task event and review record, published by the services",
		Subjects:    StreamSubjects,
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    cfg.MaxBytes,
		MaxMsgSize:  MaxEventSize,
		Duplicates:  cfg.Duplicates,
		Replicas:    cfg.Replicas,
		Discard:     discard(cfg.MaxBytes),
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", Stream, err)
	}
	// After Stream: a stream of an earlier version held the submissions
	// too, and two streams cannot share subjects.
	_, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        SubmitStream,
		Description: "dispatchmesh: every submission, as clients published it",
		Subjects:    SubmitSubjects,
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    cfg.SubmitMaxBytes,
		MaxMsgSize:  MaxEventSize,
		Duplicates:  cfg.SubmitDuplicates,
		Replicas:    cfg.Replicas,
		Discard:     discard(cfg.SubmitMaxBytes),
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", SubmitStream, err)
	}
	_, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        AdvisoryStream,
		Description: "max-delivery advisories of " + Stream + " and " + SubmitStream + " consumers, for the reaper",
		Subjects:    AdvisorySubjects,
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      cfg.MaxAge,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", AdvisoryStream, err)
	}
	_, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        CounterStream,
		Description: "dispatchmesh: what each task type spent per day, server-side counters deduplicated by outcome",
		Subjects:    []string{CounterSubjects},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Duplicates:  cfg.Duplicates,
		Replicas:    cfg.Replicas,
		// Every increment is kept for the audit horizon, not only each
		// counter's latest: a server rebuilds its Msg-Id dedup window from
		// the messages it stores, so an increment deleted early would be
		// counted again by a redelivery after a restart.
		MaxAge:          cfg.MaxAge,
		AllowMsgCounter: true,
		AllowDirect:     true,
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", CounterStream, err)
	}
	// The outcome stream: each type's newest outcomes, kept by its
	// per-subject limit, for MaxAge at most, like the gate's facts of the
	// type: a type clients made up once does not stay.
	_, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:              trust.OutcomeStream,
		Description:       "dispatchmesh: the outcomes that count for each task type's trust, the newest of each type",
		Subjects:          []string{trust.OutcomeFilter},
		MaxAge:            cfg.MaxAge,
		MaxMsgsPerSubject: trust.Keep,
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Discard:           jetstream.DiscardOld,
		Duplicates:        cfg.Duplicates,
		Replicas:          cfg.Replicas,
		AllowDirect:       true,
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", trust.OutcomeStream, err)
	}
	return nil
}

// provisionPolicyBucket creates or updates BucketPolicy: the stream a KV
// bucket would have (what nats.go's CreateKeyValue makes, so `nats kv` and
// js.KeyValue bind it), but keeping PolicyRevisions revisions of each key.
func provisionPolicyBucket(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) error {
	_, err := ensureStream(ctx, js, jetstream.StreamConfig{
		Name:              events.KVStream(BucketPolicy),
		Description:       "dispatchmesh: the per-type policies (key current), every revision kept for dispatch rebuild",
		Subjects:          []string{"$KV." + BucketPolicy + ".>"},
		MaxMsgsPerSubject: PolicyRevisions,
		MaxBytes:          -1,
		MaxMsgs:           -1,
		MaxMsgSize:        -1,
		MaxConsumers:      -1,
		Storage:           jetstream.FileStorage,
		Replicas:          cfg.Replicas,
		AllowRollup:       true,
		DenyDelete:        true,
		AllowDirect:       true,
		Duplicates:        2 * time.Minute,
		Discard:           jetstream.DiscardNew,
	})
	if err != nil {
		return fmt.Errorf("bucket %s: %w", BucketPolicy, err)
	}
	return nil
}

// ensureStream creates the stream, or updates it when it exists with
// another configuration. One that has cfg already is left as it is: every
// start of a provisioning service runs Provision, and an update rewrites
// the stream's configuration on the server even when nothing changed
// (nats-server 2.15.2 also reads a file store's configuration unlocked
// while it creates a consumer, which races such an update under -race).
// The server answers a create with the configuration a stream has as a
// success, and one with another as "already in use".
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.UpdateStream(ctx, cfg)
	}
	return s, err
}

// ensureBucket is ensureStream for a KV bucket.
func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.UpdateKeyValue(ctx, cfg)
	}
	return kv, err
}

// AllBuckets are the KV buckets Provision creates.
var AllBuckets = []string{BucketTasks, BucketTrust, BucketHistory, BucketPolicy, BucketHeld, BucketModels}

// OpenStores binds to every bucket, which must exist (admin tools).
func OpenStores(ctx context.Context, js jetstream.JetStream) (*Stores, error) {
	return OpenBuckets(ctx, js, AllBuckets...)
}

// OpenBuckets binds to the named buckets, which must exist; the others stay
// nil. A service binds only the buckets it uses, so it can run as a NATS user
// that may touch nothing else.
func OpenBuckets(ctx context.Context, js jetstream.JetStream, names ...string) (*Stores, error) {
	var st Stores
	for _, name := range names {
		p := st.field(name)
		if p == nil {
			return nil, fmt.Errorf("bucket %s: not one of the mesh's buckets %v", name, AllBuckets)
		}
		kv, err := js.KeyValue(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", name, err)
		}
		*p = kv
	}
	return &st, nil
}

// Only returns the stores of the named buckets; the others are nil.
func (s *Stores) Only(names ...string) *Stores {
	var only Stores
	for _, name := range names {
		if p := only.field(name); p != nil {
			*p = *s.field(name)
		}
	}
	return &only
}

func (s *Stores) field(bucket string) *jetstream.KeyValue {
	switch bucket {
	case BucketTasks:
		return &s.Tasks
	case BucketTrust:
		return &s.Trust
	case BucketHistory:
		return &s.History
	case BucketPolicy:
		return &s.Policy
	case BucketHeld:
		return &s.Held
	case BucketModels:
		return &s.Models
	}
	return nil
}
