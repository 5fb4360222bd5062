// Package mesh wires the services together on a NATS connection: it
// provisions the stream and buckets, builds the stores and the selected
// services, and runs each under the shared router until the context ends.
// `dispatch up` runs every service in one process; `dispatch <service>` runs one.
package mesh

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/health"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/kvcas"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/natsperm"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/policykv"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/services/gate"
	"github.com/dispatchmesh/dispatchmesh/services/intake"
	"github.com/dispatchmesh/dispatchmesh/services/prompt"
	"github.com/dispatchmesh/dispatchmesh/services/recorder"
	"github.com/dispatchmesh/dispatchmesh/services/verifier"
	"github.com/dispatchmesh/dispatchmesh/services/webhook"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// Service names, as accepted by Options.Services and the CLI.
const (
	Intake   = "intake" // also serves the micro API (dispatch.api.submit, dispatch.api.status, dispatch.api.wait)
	Verifier = "verifier"
	Gate     = "gate"
	Prompt   = "prompt"
	Executor = "executor"
	Recorder = "recorder"
	// Reaper files messages whose worker died on their last delivery.
	Reaper = "reaper"
	// Webhook delivers the wait answer of a settled task to its callback
	// URL (services/webhook). Not in All: it runs only when asked for,
	// with a signing secret (Options.Webhook).
	Webhook = "webhook"
)

// ExecutorMaxDeliver bounds deliveries of one executor message: transient
// snoozes (budget 8 per attempt), circuit snoozes and the snoozes of a tool
// wait (26 for the default 10m, about 60 for any wait) are deliveries too.
const ExecutorMaxDeliver = 200

// All is every service, in pipeline order.
var All = []string{Intake, Verifier, Gate, Prompt, Executor, Recorder, Reaper}

// Options configure a mesh process.
type Options struct {
	NC *nats.Conn // required
	JS jetstream.JetStream
	// Services to run. Default All.
	Services []string
	// Provision creates or updates the stream and buckets at start (what
	// `dispatch up` and `dispatch provision` do). Without it the services
	// bind to what exists, so they can run as least-privilege NATS users.
	Provision bool
	// Stream sizes what is provisioned.
	Stream services.StreamConfig
	// Policy holds per-type policies. Default: the policy in the bucket
	// dispatch_policy, followed with a KV watcher (policykv.Watch).
	Policy *policy.Source
	// Shadow is the shadow policy: the gate and the recorder compute every
	// decision under it too, and record it, never enforce it. Default: the
	// key shadow of the bucket dispatch_policy, followed (dispatch policy
	// shadow).
	Shadow *policy.Source
	// Model answers prompts. Default: the simulated model, rates from Policy.
	Model executor.Model
	// DefaultModel is the model name when a type names none.
	DefaultModel string
	// BaseURL and APIKey are the endpoint and key of a chain's model that
	// names none of its own; Credential resolves a chain's named
	// credentials, Dial makes the model of a chain entry with an endpoint
	// or key of its own (executor.Config). Defaults: executor's.
	BaseURL, APIKey string
	Credential      func(name string) (string, bool)
	Dial            func(baseURL, apiKey string) executor.Model
	// Circuit configures the executor's per-model breakers, shared by every
	// executor instance through bucket dispatch_models (executor.Config).
	Circuit executor.CircuitConfig
	Prices  map[string]executor.Price
	// Scoring overrides trust scoring defaults (window 50, min 10, threshold 0.15).
	Scoring trust.Policy
	// HTTPClient is used by http verifiers.
	HTTPClient *http.Client
	// Instance identifies this process (default host:pid); services publish as
	// <service>@<Instance>.
	Instance string
	Log      *slog.Logger
	// Registry receives Prometheus metrics when set.
	Registry prometheus.Registerer
	// Tracer, when set, traces every message each service handles and
	// carries the trace context from stage to stage (services.Tracing;
	// tracing.Setup makes it from the OTEL_* environment). Default none:
	// tracing off.
	Tracer trace.Tracer
	// Router settings, per service (zero: the defaults of services.Spec).
	MaxDeliver  int
	AckWait     time.Duration
	Concurrency int
	// MaxAckPending overrides every consumer's (services.Spec); a test
	// lowers it to show what needs no pending slots.
	MaxAckPending int
	// ServiceConcurrency overrides Concurrency per service (by name: Intake,
	// Verifier, …); 0 or absent: Concurrency, else the service's default.
	ServiceConcurrency map[string]int
	Grace              time.Duration
	// ErrorRules override how the executor classifies errors.
	ErrorRules executor.Rules
	// AgentEnv and CommandEnv name what of the process's environment an
	// agent command, and a command step or verifier, get besides
	// procgroup.DefaultEnv (executor.Config).
	AgentEnv, CommandEnv []string
	// AgentLimits and CommandLimits bound each process of an agent
	// command, and of a command step or verifier (executor.Config).
	// Default: none.
	AgentLimits, CommandLimits procgroup.Limits
	// Version is reported by the micro services.
	Version string
	// Health, when set, receives a readiness check per service (its
	// consumer bound and consumed) and one for the micro API of intake.
	Health *health.Checks
	// StateKey seals a task's state for the executor (services.Sealer, at
	// least services.MinStateKey bytes): intake, the verifier and the
	// recorder seal the state they wrote, the executor starts from it
	// instead of reading it. Every process running one of those services
	// needs the same key. Empty: a process that runs the executor and one
	// of the others makes a key of its own; any other process seals
	// nothing, and its executor reads.
	StateKey []byte
	// KnownTypesOnly makes intake and its submit API reject a submission
	// whose type Policy does not name, as invalid input
	// (intake.Config.KnownTypesOnly). Default false: any well-formed type.
	KnownTypesOnly bool
	// MaxTypeLabels is how many task types Policy does not name get metric
	// labels of their own in this process; later ones count as
	// type="other" (services.LabelSet, one shared by the process's
	// services). 0: services.DefaultMaxTypeLabels; negative: none, only the
	// types Policy names.
	MaxTypeLabels int
	// APIMaxRequests, APIMaxWaits and APIMaxClientWaits bound intake's
	// request API (intake.API's MaxRequests, MaxWaits, MaxClientWaits).
	// 0: intake's defaults (128, 1024, 64).
	APIMaxRequests, APIMaxWaits, APIMaxClientWaits int
	// Webhook configures the webhook service (its JS, Registry, Instance and
	// Log are the mesh's): required when Services names Webhook.
	Webhook webhook.Config

	sealer *services.Sealer
	types  *services.LabelSet
}

// typeLabels is the type label set of this process's metrics.
func (o Options) typeLabels() *services.LabelSet {
	n := o.MaxTypeLabels
	switch {
	case n == 0:
		n = services.DefaultMaxTypeLabels
	case n < 0:
		n = 0
	}
	return services.NewLabelSet(n, o.Policy.Names)
}

// sealing is what seals the state of this process's services (nil: none).
func (o Options) sealing() (*services.Sealer, error) {
	if len(o.StateKey) > 0 {
		return services.NewSealer(o.StateKey)
	}
	seals := slices.ContainsFunc(o.Services, func(s string) bool { return s == Intake || s == Verifier || s == Recorder })
	if !seals || !slices.Contains(o.Services, Executor) {
		return nil, nil
	}
	key := make([]byte, services.MinStateKey)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return services.NewSealer(key)
}

// Run provisions, starts the selected services and blocks until ctx ends and
// every service has drained.
func Run(ctx context.Context, o Options) error {
	if err := o.setDefaults(); err != nil {
		return err
	}
	var err error

	if o.Health != nil { // until its consumer is bound
		for _, name := range o.Services {
			o.Health.Add(name, func() error { return health.ErrStarting })
		}
	}

	// Each service binds only the buckets it uses (Buckets): as a
	// least-privilege NATS user it may touch nothing else.
	var stores *services.Stores
	if o.Provision {
		stores, err = services.Provision(ctx, o.JS, o.Stream)
	} else {
		stores, err = services.OpenBuckets(ctx, o.JS, bucketsOf(o.Services)...)
	}
	if err != nil {
		return startError(o.NC, err)
	}
	if o.Policy == nil && stores.Policy != nil && slices.ContainsFunc(o.Services, usesPolicy) {
		if o.Policy, err = policykv.Watch(ctx, o.JS, stores.Policy, o.Log); err != nil {
			return startError(o.NC, err)
		}
		o.Log.Info("policy from the bucket", "bucket", services.BucketPolicy, "rev", o.Policy.Rev())
	}
	if o.Shadow == nil && stores.Policy != nil && slices.ContainsFunc(o.Services, usesPolicy) {
		if o.Shadow, err = policykv.WatchWith(ctx, stores.Policy, policykv.WatchOptions{JS: o.JS, Log: o.Log, Key: policy.ShadowKey, Quiet: true}); err != nil {
			return startError(o.NC, err)
		}
	}
	if o.Model == nil {
		o.Model = executor.Simulated{Rate: executor.RateFromPolicy(o.Policy)}
	}
	o.types = o.typeLabels()
	if o.sealer, err = o.sealing(); err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	if o.sealer != nil {
		key := "this process's own"
		if len(o.StateKey) > 0 {
			key = "configured"
		}
		o.Log.Debug("task states sealed for the executor", "key", key)
	}
	specs, owners, err := o.build(ctx, stores)
	if err != nil {
		return startError(o.NC, err)
	}
	// A spec's Stop runs when its router returns; a start that fails before
	// the routers run releases what the services hold (their subscriptions).
	routing := false
	defer func() {
		if routing {
			return
		}
		stopSpecs(specs)
	}()
	metrics := o.metrics(specs)

	stats := make([]*services.RunStats, len(specs))
	for i := range specs {
		stats[i] = &services.RunStats{}
	}
	stopOps, err := o.startOps(specs, owners, stats)
	defer stopOps()
	if err != nil {
		return err
	}
	if slices.Contains(o.Services, Intake) {
		stopAPI, err := o.startAPI(ctx, stores)
		defer stopAPI()
		if err != nil {
			return err
		}
	}

	routing = true
	return o.route(ctx, specs, stats, metrics)
}

// setDefaults checks o and fills in what it leaves out.
func (o *Options) setDefaults() error {
	if o.NC == nil {
		return errors.New("mesh: NC is required")
	}
	if o.JS == nil {
		js, err := jetstream.New(o.NC)
		if err != nil {
			return err
		}
		o.JS = js
	}
	if len(o.Services) == 0 {
		o.Services = All
	}
	for _, s := range o.Services {
		if !slices.Contains(All, s) && s != Webhook {
			return fmt.Errorf("mesh: unknown service %q", s)
		}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Instance == "" {
		host, _ := os.Hostname()
		o.Instance = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if o.Version == "" {
		o.Version = "0.1.0"
	}
	return nil
}

// metrics registers the mesh's collectors with o.Registry (nil: none).
func (o Options) metrics(specs []services.Spec) *services.Metrics {
	var metrics *services.Metrics
	if o.Registry != nil {
		metrics = services.NewMetrics(o.Registry)
		var stages []string
		for _, spec := range specs {
			if spec.Name != services.ConsumerReaper { // the stages, not the advisories
				stages = append(stages, spec.Name)
			}
		}
		o.Registry.MustRegister(services.NewConsumerStats(o.JS, stages...))
		for _, c := range kvcas.Collectors() { // the process's compare-and-set conflicts
			services.Register(o.Registry, c)
		}
	}
	return metrics
}

// startOps starts the micro service of each service, ready while its
// consumers run (stats). stop stops those started, the last first; it is
// set on an error too.
func (o Options) startOps(specs []services.Spec, owners []string, stats []*services.RunStats) (stop func(), err error) {
	var stops []func() error
	stop = func() {
		for _, s := range slices.Backward(stops) {
			_ = s()
		}
	}
	// Every service answers $SRV.PING|INFO|STATS as dispatch-<service>
	// with its counters and readiness (`nats micro ls`).
	// A service with a second consumer (the gate's held passes) is one
	// micro service, ready while both consume; it counts its first's.
	for i, spec := range specs {
		if i > 0 && owners[i] == owners[i-1] {
			continue
		}
		var mine []int
		for j := i; j < len(specs) && owners[j] == owners[i]; j++ {
			mine = append(mine, j)
		}
		ready := func() error {
			for _, j := range mine {
				if !stats[j].Running() {
					return fmt.Errorf("not consuming (durable %s)", specs[j].Name)
				}
			}
			return nil
		}
		svc, err := services.StartOps(o.NC, services.OpsConfig{
			Service: owners[i], Version: o.Version, Instance: o.Instance,
			Description: "dispatchmesh " + owners[i] + ": messages handled, errors, in flight; readiness",
			Metadata:    map[string]string{"consumer": spec.Name, "stream": orDefault(spec.Stream, services.Stream)},
			Counts:      stats[i].Counts, Ready: ready,
		})
		if err != nil {
			return stop, fmt.Errorf("micro service %s: %w", services.OpsName(owners[i]), err)
		}
		stops = append(stops, svc.Stop)
		if o.Health != nil {
			o.Health.Add(owners[i], ready)
		}
	}
	return stop, checkSubscribed(o, "micro services")
}

// startAPI starts intake's request-reply API; stop stops it (it is set on
// an error too).
func (o Options) startAPI(ctx context.Context, stores *services.Stores) (stop func(), err error) {
	st := newStoresOf(Intake, stores, nil)
	api := &intake.API{JS: o.JS, Tasks: st.tasks(), Policy: o.Policy, KnownTypesOnly: o.KnownTypesOnly, Log: o.Log,
		MaxRequests: o.APIMaxRequests, MaxWaits: o.APIMaxWaits, MaxClientWaits: o.APIMaxClientWaits}
	if st.err != nil {
		return func() {}, st.err
	}
	svc, err := api.Start(o.NC, o.Version)
	if err != nil {
		return func() {}, fmt.Errorf("micro api: %w", err)
	}
	stop = func() {
		_ = svc.Stop() // first: no new requests
		api.Stop()     // then answers the waits in progress
	}
	// A stopping mesh answers its waits at once (503: ask again), not
	// after its services drained.
	context.AfterFunc(ctx, api.Stop)
	if o.Health != nil {
		o.Health.Add("api", func() error {
			if svc.Stopped() {
				return errors.New("stopped")
			}
			return nil
		})
	}
	return stop, checkSubscribed(o, "micro api")
}

// route runs a router for each spec until ctx ends or one fails.
func (o Options) route(ctx context.Context, specs []services.Spec, stats []*services.RunStats, metrics *services.Metrics) error {
	// One service failing stops them all: a mesh with a dead stage would
	// look alive while tasks pile up in front of it.
	ctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var wg sync.WaitGroup
	errs := make(chan error, len(specs))
	for i, spec := range specs {
		spec.MaxDeliver = max(o.MaxDeliver, spec.MaxDeliver)
		spec.AckWait = orDefault(o.AckWait, spec.AckWait)
		spec.MaxAckPending = orDefault(o.MaxAckPending, spec.MaxAckPending)
		spec.Concurrency = o.concurrency(spec)
		r := &services.Router{JS: o.JS, Instance: spec.Name + "@" + o.Instance, Log: o.Log, Metrics: metrics, Grace: o.Grace, Stats: stats[i], Tracer: o.Tracer}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(ctx, spec); err != nil {
				errs <- err
				stopAll()
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		// A service stopped while it was still starting (binding its
		// consumer) was stopped, not broken: by ctx, or by another's failure.
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			continue
		}
		all = append(all, startError(o.NC, err))
	}
	return errors.Join(all...)
}

// checkSubscribed returns the server's refusal of a subscription just made
// (what): a refused subscription fails silently, the endpoint would never
// answer. After a round trip the server's refusal has arrived.
func checkSubscribed(o Options, what string) error {
	if err := o.NC.FlushTimeout(10 * time.Second); err != nil {
		o.Log.Warn(what+": could not check the subscriptions", "err", err)
		return nil
	}
	if perr := natsperm.Last(o.NC); perr != nil {
		return fmt.Errorf("%s: %w", what, perr)
	}
	return nil
}

// startError names why the mesh could not bind or create what it needs: a
// refusal by the server (the NATS user's permissions lack it; the refused
// call itself only timed out), or a stream or bucket that does not exist
// (nobody provisioned).
func startError(nc *nats.Conn, err error) error {
	err = natsperm.Explain(nc, err)
	var perr *natsperm.Error
	switch {
	case errors.As(err, &perr):
		return err
	case errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w (is the mesh provisioned? run `dispatch provision` as the admin user)", err)
	}
	return err
}

// concurrency is how many messages spec's service handles at once: its own
// setting, else the mesh-wide one, else the service's default.
func (o Options) concurrency(spec services.Spec) int {
	return orDefault(o.ServiceConcurrency[spec.Name], orDefault(o.Concurrency, spec.Concurrency))
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v != zero {
		return v
	}
	return def
}

// build makes the router specs of every selected service, each with the
// stores of its own buckets, and names the service of each (owners).
func (o Options) build(ctx context.Context, all *services.Stores) (specs []services.Spec, owners []string, err error) {
	vs := newViews(o.Services, all)
	for _, name := range o.Services {
		st := newStoresOf(name, all, vs)
		var built []services.Spec
		if name == Webhook { // two consumers: settlements seen, deliveries due
			var w *webhook.Service
			if w, err = o.webhook(); err == nil {
				built = []services.Spec{w.SettleSpec(), w.Spec()}
			}
		} else if name == Gate { // three consumers: verified passes, held ones, wakes
			var g *gate.Service
			if g, err = o.gate(ctx, st); err == nil {
				built = []services.Spec{g.Spec(), g.HeldSpec(), g.WakeSpec()}
			}
		} else {
			var spec services.Spec
			spec, err = o.spec(ctx, name, st)
			built = []services.Spec{spec}
		}
		if st.err != nil { // a bucket the service may not use: say that first
			err = st.err
		}
		if err != nil {
			stopSpecs(append(specs, built...))
			return nil, nil, err
		}
		specs = append(specs, built...)
		for range built {
			owners = append(owners, name)
		}
	}
	return specs, owners, nil
}

// stopSpecs releases what built services hold (Spec.Stop) when their
// routers never ran: a router runs its spec's Stop itself.
func stopSpecs(specs []services.Spec) {
	for _, spec := range specs {
		if spec.Stop != nil {
			spec.Stop()
		}
	}
}

// webhook makes the webhook service, whose two consumers share it.
func (o Options) webhook() (*webhook.Service, error) {
	c := o.Webhook
	c.JS, c.Policy, c.Registry, c.Instance, c.Log = o.JS, o.Policy, o.Registry, Webhook+"@"+o.Instance, o.Log
	return webhook.New(c)
}

// gate makes the gate, whose two consumers (Spec, HeldSpec) share it.
func (o Options) gate(ctx context.Context, st *storesOf) (*gate.Service, error) {
	view, err := st.view(ctx, o.JS, o.Log)
	if err != nil {
		return nil, err
	}
	return gate.New(gate.Config{View: view, Trust: st.trust(o.Scoring), Spending: st.spending(o.JS), Tasks: st.tasks(), Held: st.held(), JS: o.JS, Policy: o.Policy, Shadow: o.Shadow, Scoring: o.Scoring, Registry: o.Registry, TypeLabels: o.types, Instance: Gate + "@" + o.Instance, Log: o.Log})
}

// spec makes the router spec of service name.
func (o Options) spec(ctx context.Context, name string, st *storesOf) (services.Spec, error) {
	inst := name + "@" + o.Instance
	switch name {
	case Intake:
		s, err := intake.New(intake.Config{Tasks: st.tasks().Sealing(o.sealer), JS: o.JS, Policy: o.Policy, KnownTypesOnly: o.KnownTypesOnly, Instance: inst, Log: o.Log})
		if err != nil {
			return services.Spec{}, err
		}
		return s.Spec(), nil
	case Reaper:
		return services.ReaperSpec(o.JS), nil
	case Verifier:
		s, err := verifier.New(verifier.Config{NC: o.NC, CommandEnv: o.CommandEnv, CommandLimits: o.CommandLimits, HTTPClient: o.HTTPClient, Policy: o.Policy, Tasks: st.tasks().Sealing(o.sealer), Registry: o.Registry, TypeLabels: o.types, Instance: inst, Log: o.Log})
		if err != nil {
			return services.Spec{}, err
		}
		return services.Spec{
			Name:    services.ConsumerVerifier,
			Filters: []string{events.StageFilter(events.StageQueued), events.StageFilter(events.StageRetry)},
			Handler: s.Handle, Concurrency: 8,
		}, nil
	case Gate:
		s, err := o.gate(ctx, st)
		if err != nil {
			return services.Spec{}, err
		}
		return s.Spec(), nil
	case Prompt:
		s, err := prompt.New(prompt.Config{History: st.history(), Policy: o.Policy, DefaultModel: o.DefaultModel, Instance: inst, Log: o.Log})
		if err != nil {
			return services.Spec{}, err
		}
		return services.Spec{
			Name: services.ConsumerPrompt, Filters: []string{events.StageFilter(events.StageAdmitted)},
			Handler: s.Handle, Concurrency: 8, Prefetch: services.FastPrefetch,
		}, nil
	case Executor:
		s, err := executor.New(executor.Config{
			Model: o.Model, AgentEnv: o.AgentEnv, CommandEnv: o.CommandEnv, AgentLimits: o.AgentLimits, CommandLimits: o.CommandLimits,
			DefaultModel: o.DefaultModel, Policy: o.Policy, Prices: o.Prices,
			Tasks: st.tasks().Sealing(o.sealer), NATS: o.NC, Registry: o.Registry, TypeLabels: o.types, Rules: o.ErrorRules, Instance: inst, Log: o.Log,
			ModelStates: st.models(), Circuit: o.Circuit, BaseURL: o.BaseURL, APIKey: o.APIKey, Credential: o.Credential, Dial: o.Dial,
		})
		if err != nil {
			return services.Spec{}, err
		}
		// Every transient snooze is a delivery: the executor's messages
		// need room for the transient budget and circuit snoozes.
		return services.Spec{
			Name: services.ConsumerExecutor, Filters: []string{events.StageFilter(events.StagePrompted)},
			Handler: s.Handle, Concurrency: 16, MaxDeliver: ExecutorMaxDeliver, OnDemand: true, Stop: s.Close,
		}, nil
	case Recorder:
		view, err := st.view(ctx, o.JS, o.Log)
		if err != nil {
			return services.Spec{}, err
		}
		s, err := recorder.New(recorder.Config{Tasks: st.tasks().Sealing(o.sealer), History: st.history(), Trust: view, CountSpend: true, NATS: o.NC, Policy: o.Policy, Shadow: o.Shadow, Scoring: o.Scoring, Registry: o.Registry, TypeLabels: o.types, Instance: inst, Log: o.Log})
		if err != nil {
			return services.Spec{}, err
		}
		return s.Spec(), nil
	}
	return services.Spec{}, fmt.Errorf("mesh: unknown service %q", name)
}
