package mesh

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Access is what a service does with the KV buckets and the outcome
// streams.
type Access struct {
	// Reads are the buckets it only reads; Writes those it also writes.
	Reads, Writes []string
	// Follows are the outcome streams it reads (an ordered consumer, or a
	// direct get); Publishes those it publishes to.
	Follows, Publishes []string
}

// All is every bucket the service uses.
func (a Access) All() []string { return slices.Concat(a.Writes, a.Reads) }

// Buckets is the KV buckets each service uses: the one place to change when
// a service starts using a bucket. A service binds exactly these at start,
// so it runs as a NATS user that may touch nothing else, and
// deploy/nats/users.conf grants exactly these (deploy/deploy_test.go
// compares them: a bucket in Writes needs $KV.<bucket>.>, one in Reads must
// not have it). A service that asks build for a store not listed here fails
// to start.
//
// Every service that decides with the policy reads (watches) the policy
// bucket; none writes it: only an admin changes the policy (dispatch policy
// set, nats kv put). The outcome stream is no bucket: the recorder
// publishes every outcome that counts for trust to it, the gate and the
// recorder follow it into windows in memory.
var Buckets = map[string]Access{
	Intake:   {Writes: []string{services.BucketTasks}, Reads: []string{services.BucketPolicy}}, // the submit/status API too
	Verifier: {Writes: []string{services.BucketTasks}, Reads: []string{services.BucketPolicy}},
	Gate: {Writes: []string{services.BucketTrust, services.BucketTasks, services.BucketHeld}, Reads: []string{services.BucketPolicy},
		Follows: []string{services.OutcomeStream}, Publishes: []string{services.OutcomeStream}}, // a handoff's end marker
	Prompt:   {Reads: []string{services.BucketHistory, services.BucketPolicy}},
	Executor: {Writes: []string{services.BucketTasks, services.BucketModels}, Reads: []string{services.BucketPolicy}},
	Recorder: {Writes: []string{services.BucketTasks, services.BucketHistory}, Reads: []string{services.BucketPolicy},
		Follows: []string{services.OutcomeStream}, Publishes: []string{services.OutcomeStream}},
	Reaper: {}, // reads DISPATCH messages, no bucket, no policy
	// The webhook service reads every task state write (a durable consumer
	// on the bucket's stream, KV_dispatch_tasks) and writes none; the policy
	// names a type's callback URL.
	Webhook: {Reads: []string{services.BucketTasks, services.BucketPolicy}},
}

// bucketsOf is every bucket the named services use, each once.
func bucketsOf(names []string) []string {
	var all []string
	for _, name := range names {
		for _, b := range Buckets[name].All() {
			if !slices.Contains(all, b) {
				all = append(all, b)
			}
		}
	}
	return all
}

// storesOf hands one service the stores of the buckets Buckets lists for
// it. Asking for another records an error: the table is out of date.
type storesOf struct {
	service string
	kv      *services.Stores // only the service's buckets; the others nil
	views   *views           // the outcome windows this process follows
	err     error
}

// newStoresOf: vs is the Views the services of the build share; nil, one
// of the service's own.
func newStoresOf(service string, all *services.Stores, vs *views) *storesOf {
	if vs == nil {
		vs = newViews([]string{service}, all)
	}
	return &storesOf{service: service, kv: all.Only(Buckets[service].All()...), views: vs}
}

func (s *storesOf) unlisted(bucket string) {
	if s.err == nil {
		s.err = fmt.Errorf("mesh: service %s uses bucket %s, which mesh.Buckets does not list for it", s.service, bucket)
	}
}

func (s *storesOf) tasks() *services.TaskStore {
	if s.kv.Tasks == nil {
		s.unlisted(services.BucketTasks)
		return nil
	}
	return services.NewTaskStore(s.kv.Tasks)
}

func (s *storesOf) held() *services.HeldIndex {
	if s.kv.Held == nil {
		s.unlisted(services.BucketHeld)
		return nil
	}
	return services.NewHeldIndex(s.kv.Held)
}

func (s *storesOf) trust(scoring trust.Policy) *trust.Store {
	if s.kv.Trust == nil {
		s.unlisted(services.BucketTrust)
		return nil
	}
	return trust.NewStore(s.kv.Trust, scoring)
}

// spending is the spend counters (stream DISPATCH_COUNTERS): the recorder
// counts, the gate reads them for a type with a daily budget. Bound on first
// use, so a service that never reads them needs no permission for them.
func (s *storesOf) spending(js jetstream.JetStream) *trust.Spending {
	return trust.NewSpending(js, services.CounterStream)
}

// follows reports whether the service may read stream (or records an error).
func (s *storesOf) follows(stream string) bool {
	if !slices.Contains(Buckets[s.service].Follows, stream) {
		if s.err == nil {
			s.err = fmt.Errorf("mesh: service %s reads stream %s, which mesh.Buckets does not list for it", s.service, stream)
		}
		return false
	}
	return true
}

// view is the trust outcomes followed into windows in memory (and, for
// the gate, its facts): one View for every service of this process that
// follows them, so each outcome is delivered, decoded and folded once,
// however many of them read it.
func (s *storesOf) view(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*trust.View, error) {
	if !s.follows(services.OutcomeStream) {
		return nil, s.err
	}
	return s.views.get(ctx, js, log)
}

// views makes the View the services of one build share, on first use; it
// is stopped when the ctx of that use ends. facts is the trust bucket when
// a service of the build reads the gate's facts (the gate), else nil. Not
// safe for concurrent use: build makes its services one after another.
type views struct {
	facts jetstream.KeyValue
	view  *trust.View
}

func newViews(names []string, all *services.Stores) *views {
	vs := &views{}
	for _, name := range names {
		a := Buckets[name]
		if slices.Contains(a.Follows, services.OutcomeStream) && slices.Contains(a.All(), services.BucketTrust) {
			vs.facts = all.Trust
		}
	}
	return vs
}

func (vs *views) get(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*trust.View, error) {
	if vs.view != nil {
		return vs.view, nil
	}
	v, err := trust.NewView(ctx, js, vs.facts, log)
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, v.Stop)
	vs.view = v
	return v, nil
}

// models is the bucket of the models' circuits and marks.
func (s *storesOf) models() jetstream.KeyValue {
	if s.kv.Models == nil {
		s.unlisted(services.BucketModels)
		return nil
	}
	return s.kv.Models
}

func (s *storesOf) history() *history.Store {
	if s.kv.History == nil {
		s.unlisted(services.BucketHistory)
		return nil
	}
	return history.NewStore(s.kv.History)
}

// usesPolicy reports whether a service decides with the policy (reads the
// policy bucket).
func usesPolicy(service string) bool {
	return slices.Contains(Buckets[service].Reads, services.BucketPolicy)
}
