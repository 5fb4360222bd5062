package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/dirlock"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/health"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/natsperm"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

const version = "0.1.0"

// cmdUp runs an embedded NATS server that listens on DISPATCH_NATS_LISTEN and
// every service in this process.
func cmdUp(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := cfg.logger()
	// One store, one process: a second `up` on the same data dir would open
	// the same JetStream store beside the first.
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("DISPATCH_DATA_DIR: %w", err)
	}
	lock, err := dirlock.Acquire(dataDir)
	if err != nil {
		return fmt.Errorf("data dir %w: only one `dispatch up` may use it; stop that one or set DISPATCH_DATA_DIR", err)
	}
	defer lock.Release()
	// Every address is checked before anything starts: beyond localhost,
	// the NATS server without a login or the page without a token, `up`
	// refuses to start.
	opts, err := embeddedOptions(cfg, dataDir)
	if err != nil {
		return err
	}
	var webLn net.Listener
	var token, apiToken string
	if cfg.HTTPListen != "" && cfg.HTTPListen != "off" {
		ln, err := web.Listen(cfg.HTTPListen, cfg.HTTPToken)
		if err != nil {
			return fmt.Errorf("review page (DISPATCH_HTTP_LISTEN, \"off\" to disable): %w", err)
		}
		webLn = ln
		defer ln.Close()
		token = pageToken(cfg)
		apiToken = clientToken(cfg, ln)
	}
	ns, err := startServer(opts, cfg.NATSListen)
	if err != nil {
		return err
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	url := ns.ClientURL()
	// The stream and buckets exist, and the policy bucket holds a policy,
	// before any service starts.
	policyLine, err := provision(ctx, cfg, url, "dispatch-up", log)
	if err != nil {
		return err
	}
	// When the mesh stops (or fails to start) the page stops too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	checks := &health.Checks{}
	var more []prometheus.Collector
	if webLn != nil {
		page, stop, err := startWeb(ctx, cfg, log, url, webLn, token, apiToken)
		if err != nil {
			return err
		}
		defer stop()
		defer cancel() // runs before stop: stop waits for the page to end
		checks.Add("web", page.ready)
		more = append(more, page.queue)
	}
	// "is up" means it: the services run and the API answers, so a client
	// that starts when it reads the banner is served.
	served := make(chan error, 1)
	names := mesh.All
	if cfg.WebhookSecret != "" {
		names = append(slices.Clone(names), mesh.Webhook)
	}
	go func() { served <- serve(ctx, cfg, log, url, "dispatch-up", names, checks, more...) }()
	if err := waitAPI(ctx, cfg, url, served); err != nil {
		return err
	}
	// One write: whoever reads "is up" reads the whole banner.
	var banner strings.Builder
	fmt.Fprintf(&banner, "dispatchmesh %s is up\n", version)
	b := bannerInfo{url: url, user: opts.Username, dataDir: dataDir, model: modelLabel(cfg),
		policy: policyLine, metrics: cfg.MetricsListen}
	if webLn != nil {
		b.review = webURL(webLn, cfg.HTTPToken, token)
		b.api = apiLine(webLn, cfg.HTTPClientToken, apiToken)
		if apiToken != "" {
			b.apiBase, b.apiAuth = apiBase(webLn), apiAuth(cfg.HTTPClientToken, apiToken)
		}
	}
	writeBanner(&banner, b)
	fmt.Print(banner.String())
	return <-served
}

// bannerInfo is what up's banner reports.
type bannerInfo struct {
	url, user, dataDir, model, policy, metrics, review string
	// api is the client API's line; apiBase and apiAuth, when it is on,
	// its URL and Authorization header for the curl lines.
	api, apiBase, apiAuth string
}

// bannerHTTPTaskID is the id of the task the banner's curl lines submit
// and wait for.
const bannerHTTPTaskID = "first-http-task"

// bannerTaskID is the id of the task the banner's lines submit and wait
// for: the submit line prints it, the wait line asks for it.
const bannerTaskID = "first-task"

// writeBanner writes the lines after "is up". Every command it prints
// works pasted into a shell as it is, whatever the port: the nats lines
// name the server (-s; with a login they read NATS_USER and NATS_PASSWORD,
// as the NATS line says to export), the dispatch lines set NATS_URL, and
// the wait line asks for the id the submit line printed. TestUpBannerLinesWork
// runs them.
func writeBanner(w io.Writer, b bannerInfo) {
	if b.user != "" {
		fmt.Fprintf(w, "  NATS:     %s  (login required; clients: export NATS_URL=%s NATS_USER=%s NATS_PASSWORD=…)\n", b.url, b.url, b.user)
	} else {
		fmt.Fprintf(w, "  NATS:     %s  (clients: export NATS_URL=%s)\n", b.url, b.url)
	}
	fmt.Fprintf(w, "  data dir: %s\n", b.dataDir)
	fmt.Fprintf(w, "  model:    %s\n", b.model)
	fmt.Fprintf(w, "  policy:   %s\n", b.policy)
	fmt.Fprintf(w, "            NATS_URL=%s dispatch policy get > policy.json   # edit it, then:\n", b.url)
	fmt.Fprintf(w, "            NATS_URL=%s dispatch policy set policy.json     # every service applies it at once\n", b.url)
	if b.metrics != "" {
		fmt.Fprintf(w, "  metrics:  http://%s/metrics  (health: /healthz, /readyz)\n", b.metrics)
	}
	if b.review != "" {
		fmt.Fprintf(w, "  review:   %s\n", b.review)
	}
	fmt.Fprintf(w, "  submit:   nats -s %s req --raw %s '{\"id\":\"%s\",\"type\":\"css_fix\",\"subject\":\"src/app.css\",\"payload\":{\"issue\":\"button misaligned\"}}'\n",
		b.url, events.SubmitAPI, bannerTaskID)
	fmt.Fprintf(w, "            NATS_URL=%s dispatch submit -type css_fix -subject src/app.css -wait\n", b.url)
	fmt.Fprintf(w, "  wait:     nats -s %s req --raw --timeout 65s %s '{\"id\":\"%s\",\"timeout\":\"60s\"}'\n",
		b.url, events.APIWait, bannerTaskID)
	if b.api != "" {
		fmt.Fprintf(w, "  api:      %s\n", b.api)
	}
	if b.apiBase != "" {
		fmt.Fprintf(w, "            curl -sS -H \"%s\" -d '{\"id\":\"%s\",\"type\":\"css_fix\",\"subject\":\"src/app.css\"}' %s\n",
			b.apiAuth, bannerHTTPTaskID, b.apiBase)
		fmt.Fprintf(w, "            curl -sS -H \"%s\" '%s/%s?wait=60s'\n", b.apiAuth, b.apiBase, bannerHTTPTaskID)
	}
}

// waitAPI returns once the micro service "dispatch" at url answers a ping,
// or with serve's error if it stops first.
func waitAPI(ctx context.Context, cfg Config, url string, served <-chan error) error {
	nc, err := cfg.connect(url, "dispatch-up-ready")
	if err != nil {
		return err
	}
	defer nc.Close()
	for {
		if _, err := nc.Request("$SRV.PING."+services.MicroService, nil, time.Second); err == nil {
			return nil
		}
		select {
		case err := <-served:
			if err == nil {
				err = ctx.Err()
			}
			return err
		case <-ctx.Done():
			return <-served
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startWeb serves the review page on ln, requiring token, on its own
// connection to url, until ctx ends; stop waits for it to finish.
func startWeb(ctx context.Context, cfg Config, log *slog.Logger, url string, ln net.Listener, token, apiToken string) (page *webPage, stop func(), err error) {
	nc, err := cfg.connect(url, "web")
	if err != nil {
		return nil, nil, err
	}
	page, err = newWebPage(ctx, cfg, nc, log, token, apiToken)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := page.serve(ctx, ln, log); err != nil {
			log.Error("review page stopped", "err", err)
		}
	}()
	return page, func() { <-done; page.stop(); nc.Close() }, nil
}

// errNATSLoginRequired: DISPATCH_NATS_LISTEN is reachable from other
// machines and no login is configured for the embedded server.
var errNATSLoginRequired = errors.New("embedded NATS server: a login is required to listen beyond localhost")

// embeddedOptions is the embedded server of `dispatch up`: one client
// listener on DISPATCH_NATS_LISTEN and no other (no monitoring, websocket,
// MQTT, cluster, gateway, leaf node or profiling port). With
// DISPATCH_NATS_USER and DISPATCH_NATS_PASSWORD it requires that login of
// every client, `up`'s own connections included; without them it may only
// listen on a loopback address, where the quick start needs nothing.
func embeddedOptions(cfg Config, dataDir string) (*server.Options, error) {
	local, err := web.Loopback(cfg.NATSListen)
	if err != nil {
		return nil, fmt.Errorf("DISPATCH_NATS_LISTEN: %w", err)
	}
	host, portStr, _ := net.SplitHostPort(cfg.NATSListen) // Loopback parsed it
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("DISPATCH_NATS_LISTEN %q: bad port", cfg.NATSListen)
	}
	switch {
	case (cfg.NATSUser == "") != (cfg.NATSPassword == ""):
		return nil, errors.New("dispatch up: set both DISPATCH_NATS_USER and DISPATCH_NATS_PASSWORD (the embedded server's login), or neither")
	case cfg.NATSUser != "" && cfg.NATSCreds != "":
		return nil, errors.New("dispatch up: the embedded server knows only DISPATCH_NATS_USER and DISPATCH_NATS_PASSWORD; unset DISPATCH_NATS_CREDS")
	case cfg.NATSUser == "" && !local:
		return nil, fmt.Errorf("%w: DISPATCH_NATS_LISTEN %q is not a loopback address; set DISPATCH_NATS_USER and DISPATCH_NATS_PASSWORD "+
			"(every client then needs them), or listen on 127.0.0.1", errNATSLoginRequired, cfg.NATSListen)
	}
	return &server.Options{
		ServerName: "dispatch-up",
		Host:       host,
		Port:       port,
		Username:   cfg.NATSUser,
		Password:   cfg.NATSPassword,
		JetStream:  true,
		StoreDir:   filepath.Join(dataDir, "jetstream"),
		NoSigs:     true,
	}, nil
}

// startServer starts the embedded server on opts (addr names its listener
// in errors).
func startServer(opts *server.Options, addr string) (*server.Server, error) {
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS server did not start on %s (port in use?)", addr)
	}
	return ns, nil
}

func modelLabel(cfg Config) string {
	if cfg.OpenAIAPIKey == "" {
		return "SIMULATED (no DISPATCH_OPENAI_API_KEY set: answers are made up, deterministic, succeed unless a type's simulated_success_rate says otherwise)"
	}
	return fmt.Sprintf("%s at %s", cfg.Model, cfg.OpenAIBaseURL)
}

// cmdService runs one service against NATS_URL.
func cmdService(ctx context.Context, cfg Config, name string, args []string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return serve(ctx, cfg, cfg.logger(), "", name, []string{name}, &health.Checks{})
}

// serve connects and runs the named services until ctx ends. checks
// receive a readiness check per service (and may hold the process's other
// parts'); more are the metrics of those parts.
func serve(ctx context.Context, cfg Config, log *slog.Logger, url, connName string, names []string, checks *health.Checks, more ...prometheus.Collector) error {
	// Before any command runs: none may read this process's secrets.
	if err := procgroup.HideEnviron(); err != nil {
		return fmt.Errorf("hide the environment from commands (prctl PR_SET_DUMPABLE): %w", err)
	}
	nc, err := cfg.connect(url, connName)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		log.Error("nats error", "err", err)
	})
	provisioning := connName == "dispatch-up" || cfg.Provision // `up` owns its embedded server
	switch {
	case provisioning && connName != "dispatch-up": // `up` provisioned already
		if _, err := provision(ctx, cfg, url, connName, log); err != nil {
			return err
		}
	case !provisioning && cfg.PolicyFile != "":
		log.Warn("DISPATCH_POLICY_FILE is ignored: services read the policy from the bucket; change it with dispatch policy set FILE",
			"file", cfg.PolicyFile, "bucket", services.BucketPolicy)
	}

	prices, _ := parsePrices(cfg.Prices)
	table := map[string]executor.Price{}
	for m, p := range prices {
		table[m] = executor.Price{InputPerMTok: p.In, OutputPerMTok: p.Out}
	}
	var model executor.Model // nil: the simulated model, rates from the policy in the bucket
	if cfg.OpenAIAPIKey == "" {
		if contains(names, mesh.Executor) {
			log.Warn("no DISPATCH_OPENAI_API_KEY: the executor uses the SIMULATED model; answers are made up")
		}
	} else {
		model = executor.NewOpenAI(executor.OpenAIConfig{BaseURL: cfg.OpenAIBaseURL, APIKey: cfg.OpenAIAPIKey})
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(more...)
	for _, name := range names { // until mesh.Run checks them itself
		checks.Add(name, func() error { return health.ErrStarting })
	}
	if cfg.MetricsListen != "" {
		stop, err := serveMetrics(cfg.MetricsListen, reg, nc, checks, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	traces, err := startTracing(ctx, log)
	if err != nil {
		return err
	}
	defer traces.stop()
	stateKey, _ := cfg.stateKey() // validated with the config
	agentLimits, _ := cfg.agentLimits()
	commandLimits, _ := cfg.commandLimits()
	err = mesh.Run(ctx, mesh.Options{
		NC: nc, Services: names, Model: model, DefaultModel: cfg.Model, Prices: table, // Policy: from the bucket
		Provision: provisioning,
		Stream:    cfg.streamConfig(),
		Log:       log, Registry: reg, Tracer: traces.Tracer(), MaxDeliver: cfg.MaxDeliver, AckWait: cfg.AckWait,
		Concurrency: cfg.Concurrency, ServiceConcurrency: cfg.serviceConcurrency(), Grace: cfg.Grace, Version: version,
		Health: checks, Instance: instance(), StateKey: stateKey, AgentEnv: cfg.AgentEnv, CommandEnv: cfg.CommandEnv,
		AgentLimits: agentLimits, CommandLimits: commandLimits,
		ErrorRules: cfg.errorRules(), Circuit: cfg.circuit(), BaseURL: cfg.OpenAIBaseURL, APIKey: cfg.OpenAIAPIKey,
		KnownTypesOnly: cfg.KnownTypesOnly, MaxTypeLabels: cfg.maxTypeLabels(),
		APIMaxRequests: cfg.APIMaxRequests, APIMaxWaits: cfg.APIMaxWaits, APIMaxClientWaits: cfg.APIMaxClientWaits,
		Webhook: cfg.webhook(),
	})
	if err == nil || errors.Is(err, context.Canceled) {
		log.Info("stopped cleanly")
		return nil
	}
	return err
}

// processTraces is the process's trace exporter (nil: tracing off).
type processTraces struct {
	*tracing.Provider
	log *slog.Logger
}

// startTracing exports traces over OTLP/HTTP when the OTEL_EXPORTER_OTLP_*
// variables ask for them (tracing.Setup).
func startTracing(ctx context.Context, log *slog.Logger) (processTraces, error) {
	p, err := tracing.Setup(ctx)
	if err != nil {
		return processTraces{}, err
	}
	if p != nil {
		// The SDK reports a failed export here: into the process's log.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: spans not exported", "err", err) }))
		log.Info("tracing: spans exported over OTLP/HTTP",
			"endpoint", cmp.Or(os.Getenv(tracing.EnvTracesEndpoint), os.Getenv(tracing.EnvEndpoint)))
	}
	return processTraces{Provider: p, log: log}, nil
}

// stop flushes the spans still batched, once every service has drained:
// the last messages' spans are exported too.
func (t processTraces) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		t.log.Warn("tracing: spans not flushed", "err", err)
	}
}

// instance names this process in micro services and published headers.
func instance() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// serveMetrics serves /metrics from reg, /healthz (the process runs) and
// /readyz (nc is connected and every check passes; 503 with the reason
// otherwise) on addr.
func serveMetrics(addr string, reg *prometheus.Registry, nc *nats.Conn, checks *health.Checks, log *slog.Logger) (func(), error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	health.Handle(mux, nc, checks)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("DISPATCH_METRICS_LISTEN: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// cmdProvision creates or updates the stream, the advisory stream and the
// buckets, then exits. Run it as a NATS user allowed to (admin in deploy/);
// the services then run as least-privilege users and only bind.
func cmdProvision(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("provision", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	line, err := provision(ctx, cfg, "", "client", cfg.logger())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "provisioned: streams %s and %s (%s, %d replicas), %s, %s, %s, buckets %s %s %s %s\n", services.Stream, services.SubmitStream, cfg.MaxAge,
		cfg.Replicas, services.AdvisoryStream, services.CounterStream, services.OutcomeStream,
		services.BucketTasks, services.BucketTrust, services.BucketHistory, services.BucketPolicy)
	fmt.Fprintf(stdout, "policy: %s\n", line)
	return nil
}

// provision creates or updates the stream and buckets on its own
// connection and seeds the policy bucket (seedPolicy); it returns which
// policy revision is in force.
func provision(ctx context.Context, cfg Config, url, connName string, log *slog.Logger) (string, error) {
	nc, err := cfg.connect(url, connName)
	if err != nil {
		return "", err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return "", err
	}
	st, err := services.Provision(ctx, js, cfg.streamConfig())
	if err != nil {
		return "", natsperm.Explain(nc, err)
	}
	return seedPolicy(ctx, cfg, st.Policy, log)
}
