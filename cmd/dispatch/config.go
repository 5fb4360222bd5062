package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/services/webhook"
)

// Config is read from the environment, prefix DISPATCH_ (e.g.
// DISPATCH_DATA_DIR); the NATS URL is read from NATS_URL, like every NATS
// client (see resolveNATSURL).
type Config struct {
	// NATSURL is where client commands and single services connect:
	// NATS_URL, or DISPATCH_NATS_URL (still honoured), default
	// nats://127.0.0.1:4222. Set by loadConfig.
	NATSURL string `ignored:"true"`
	// NATSCreds is a credentials file; NATSUser/NATSPassword a plain login,
	// which `dispatch up`'s embedded server then requires of every client.
	NATSCreds    string `envconfig:"NATS_CREDS"`
	NATSUser     string `envconfig:"NATS_USER"`
	NATSPassword string `envconfig:"NATS_PASSWORD"`
	// NATSCA is a PEM file of the CA the NATS server's certificate is
	// checked against (deploy/nats/tls/mkcerts.sh makes one). Default: the
	// system's roots. The connection uses TLS when the server requires it
	// or the URL is tls://.
	NATSCA string `envconfig:"NATS_CA"`
	// NATSListen is where `dispatch up` runs its embedded NATS server.
	// Default 127.0.0.1:4222, no login; an address beyond loopback requires
	// NATSUser and NATSPassword.
	NATSListen string `envconfig:"NATS_LISTEN" default:"127.0.0.1:4222"`
	// DataDir holds the embedded server's JetStream store.
	DataDir string `envconfig:"DATA_DIR" default:"./dispatch-data"`

	// OpenAIBaseURL is any OpenAI-compatible endpoint (OpenAI, Azure, Ollama, vLLM, LiteLLM).
	OpenAIBaseURL string `envconfig:"OPENAI_BASE_URL" default:"https://api.openai.com/v1"`
	// OpenAIAPIKey enables the real model; without it the executor uses the
	// built-in simulated model.
	OpenAIAPIKey string `envconfig:"OPENAI_API_KEY"`
	// ModelFailures transient failures of a model within ModelWindow cool
	// it down for ModelCoolDown (doubling up to ModelMaxCoolDown while its
	// probes fail), for every executor instance; a model whose key or
	// name the deployment got wrong is not called for ModelDeadFor
	// (executor.CircuitConfig). ModelFailures -1 disables the breaker.
	ModelFailures    int           `envconfig:"MODEL_FAILURES" default:"5"`
	ModelWindow      time.Duration `envconfig:"MODEL_WINDOW" default:"1m"`
	ModelCoolDown    time.Duration `envconfig:"MODEL_COOLDOWN" default:"30s"`
	ModelMaxCoolDown time.Duration `envconfig:"MODEL_MAX_COOLDOWN" default:"5m"`
	ModelDeadFor     time.Duration `envconfig:"MODEL_DEAD_FOR" default:"1h"`
	// Model is the default model; a type's policy may name another.
	Model string `envconfig:"MODEL" default:"gpt-4o-mini"`
	// Prices per model, USD per million tokens input/output: "gpt-4o=2.5/10,gpt-4o-mini=0.15/0.6".
	Prices string `envconfig:"PRICES" default:"gpt-4o=2.5/10,gpt-4o-mini=0.15/0.6"`
	// ErrorClasses overrides how a status code is classified:
	// "409=transient,418=deterministic" (classes: transient, deterministic,
	// auth, quota, config). QuotaBody and RateLimitBody add 429 body
	// substrings; ContextLengthBody adds 400 body substrings saying the
	// prompt exceeds the model's context (class config).
	ErrorClasses      string   `envconfig:"ERROR_CLASSES"`
	QuotaBody         []string `envconfig:"QUOTA_BODY"`
	RateLimitBody     []string `envconfig:"RATE_LIMIT_BODY"`
	ContextLengthBody []string `envconfig:"CONTEXT_LENGTH_BODY"`
	// AgentEnv and CommandEnv name the environment variables (a trailing *
	// is a prefix) an agent command, and a command step or verifier, get
	// besides PATH, HOME, the locale and the like (procgroup.DefaultEnv):
	// "ANTHROPIC_API_KEY" for an agent CLI, say. Nothing else of the
	// service's environment reaches a command: not its model key, NATS
	// password or state key.
	AgentEnv   []string `envconfig:"AGENT_ENV"`
	CommandEnv []string `envconfig:"COMMAND_ENV"`
	// AgentCPU, AgentMemory and AgentFiles bound each process of an agent
	// command, CommandCPU, CommandMemory and CommandFiles each process of a
	// command step or verifier (procgroup.Limits): its CPU time (a
	// duration, whole seconds: "10m"), its writable memory (bytes, or a
	// number of KiB, MiB, GiB or TiB: "4GiB") and its open files. "0" or
	// "off" leaves the resource unlimited (as the service has it). Defaults:
	// procgroup.DefaultLimits — 10m, 4GiB, 1024.
	AgentCPU      string `envconfig:"AGENT_CPU" default:"10m"`
	AgentMemory   string `envconfig:"AGENT_MEMORY" default:"4GiB"`
	AgentFiles    string `envconfig:"AGENT_FILES" default:"1024"`
	CommandCPU    string `envconfig:"COMMAND_CPU" default:"10m"`
	CommandMemory string `envconfig:"COMMAND_MEMORY" default:"4GiB"`
	CommandFiles  string `envconfig:"COMMAND_FILES" default:"1024"`
	// PolicyFile holds per-type policies (JSON) that `up` and `provision`
	// seed the policy bucket with when it is empty; services read the bucket.
	PolicyFile string `envconfig:"POLICY_FILE"`
	// KnownTypesOnly makes intake and its submit API reject a submission
	// whose type the policy does not name (under "types"), as invalid
	// input: kept on dispatch.review.rejected, answered 400. Default false:
	// `dispatch up` takes any well-formed type; deploy/ sets it.
	KnownTypesOnly bool `envconfig:"KNOWN_TYPES_ONLY"`
	// APIMaxRequests, APIMaxWaits and APIMaxClientWaits bound intake's
	// request API, per instance (intake.API): submit and status requests
	// served at once, waits and watches held at once, and those one client
	// holds. 0: intake's defaults, 128, 1024 and 64.
	APIMaxRequests    int `envconfig:"API_MAX_REQUESTS"`
	APIMaxWaits       int `envconfig:"API_MAX_WAITS"`
	APIMaxClientWaits int `envconfig:"API_MAX_CLIENT_WAITS"`

	// HTTPListen is where `dispatch up` and `dispatch web` serve the review
	// page and its JSON API. Default 127.0.0.1:8080; "off" turns it off in
	// `dispatch up`. An address beyond loopback requires HTTPToken.
	HTTPListen string `envconfig:"HTTP_LISTEN" default:"127.0.0.1:8080"`
	// HTTPToken is required by the review page and API (Authorization:
	// Bearer, or ?token= once in a browser). Default: none, which restricts
	// HTTPListen to loopback addresses; the process then makes a token at
	// every start and prints the page's address with it.
	HTTPToken string `envconfig:"HTTP_TOKEN"`
	// HTTPClientToken is what the client HTTP API (/api/v1/ on the same
	// listener) requires, as Authorization: Bearer — never HTTPToken,
	// which resolves and requeues. Default: on a loopback listener, a new
	// one each start, printed in up's banner; beyond loopback, none: the
	// API is off until one is set. "off" turns the API off.
	HTTPClientToken string `envconfig:"HTTP_CLIENT_TOKEN"`
	// HTTPMaxWaits bounds the client API's waits held at once (past it:
	// 503). Default web.DefaultMaxClientWaits (1,024).
	HTTPMaxWaits int `envconfig:"HTTP_MAX_WAITS"`

	// MetricsListen serves /metrics and /healthz when set.
	MetricsListen string `envconfig:"METRICS_LISTEN"`
	// MetricsTypeLabels is how many task types the policy does not name
	// get metric labels of their own, per process; later ones count as
	// type="other" (the types the policy names always have theirs). 0:
	// only the named types. Default 100 (services.DefaultMaxTypeLabels).
	MetricsTypeLabels int `envconfig:"METRICS_TYPE_LABELS" default:"100"`
	// Provision makes a single service create or update the stream and
	// buckets at start (`dispatch up` always does; `dispatch provision` only
	// does that).
	Provision bool `envconfig:"PROVISION"`
	// Replicas of the stream and buckets (3 in a cluster).
	Replicas int `envconfig:"REPLICAS" default:"1"`
	// MaxAge is how long events are kept (the audit horizon).
	MaxAge time.Duration `envconfig:"MAX_AGE" default:"720h"`
	// Duplicates is the Msg-Id deduplication window.
	Duplicates time.Duration `envconfig:"DUPLICATES" default:"2h"`
	// SubmitDuplicates is the Msg-Id deduplication window of the clients'
	// submissions (stream DISPATCH_SUBMIT): a client's retried publish.
	// Intake makes one task per id for as long as the task is kept anyway.
	SubmitDuplicates time.Duration `envconfig:"SUBMIT_DUPLICATES" default:"2m"`
	// StreamMaxBytes and SubmitMaxBytes bound the event stream and the
	// submissions' stream ("12GiB"; "0" or "off": unlimited); past it the
	// oldest messages go.
	StreamMaxBytes string `envconfig:"STREAM_MAX_BYTES" default:"off"`
	SubmitMaxBytes string `envconfig:"SUBMIT_MAX_BYTES" default:"off"`
	// MaxDeliver bounds deliveries of one message before it goes to review.
	MaxDeliver int `envconfig:"MAX_DELIVER" default:"10"`
	// AckWait is how long a worker owns a message without a heartbeat.
	AckWait time.Duration `envconfig:"ACK_WAIT" default:"30s"`
	// Concurrency is how many messages each service instance handles at once
	// (0: the service's default — 16 for the executor, 8 for the others).
	Concurrency int `envconfig:"CONCURRENCY"`
	// Per-service concurrency, over Concurrency: a slow model wants many
	// executor workers without as many recorders contending. 0: Concurrency.
	IntakeConcurrency   int `envconfig:"INTAKE_CONCURRENCY"`
	VerifierConcurrency int `envconfig:"VERIFIER_CONCURRENCY"`
	GateConcurrency     int `envconfig:"GATE_CONCURRENCY"`
	PromptConcurrency   int `envconfig:"PROMPT_CONCURRENCY"`
	ExecutorConcurrency int `envconfig:"EXECUTOR_CONCURRENCY"`
	RecorderConcurrency int `envconfig:"RECORDER_CONCURRENCY"`
	// StateKey (base64, at least 32 bytes decoded) seals a task's state for
	// the executor: give the same key to every intake, verifier, recorder
	// and executor process, and the executor starts each attempt from the
	// state the last writer sealed instead of reading it. Unset: a process
	// running the executor with one of the others makes its own; the
	// others seal nothing.
	StateKey string `envconfig:"STATE_KEY"`
	// WebhookSecret signs every webhook delivery (HMAC-SHA256, at least 16
	// bytes); setting it makes `dispatch up` run the webhook service too.
	// WebhookAllowHosts are the callback hosts deliveries may go to
	// (webhook.Hosts: exact names, *.suffix, IPs, or *); none: every
	// callback is refused. WebhookAllowPrivate lets a delivery reach
	// loopback, link-local and private addresses. WebhookMaxAttempts,
	// WebhookBackoff, WebhookBackoffMax and WebhookTimeout shape the tries.
	WebhookSecret       string        `envconfig:"WEBHOOK_SECRET"`
	WebhookAllowHosts   []string      `envconfig:"WEBHOOK_ALLOW_HOSTS"`
	WebhookAllowPrivate bool          `envconfig:"WEBHOOK_ALLOW_PRIVATE"`
	WebhookMaxAttempts  int           `envconfig:"WEBHOOK_MAX_ATTEMPTS" default:"12"`
	WebhookBackoff      time.Duration `envconfig:"WEBHOOK_BACKOFF" default:"5s"`
	WebhookBackoffMax   time.Duration `envconfig:"WEBHOOK_BACKOFF_MAX" default:"15m"`
	WebhookTimeout      time.Duration `envconfig:"WEBHOOK_TIMEOUT" default:"10s"`
	// Grace is how long in-flight work may finish after SIGTERM.
	Grace time.Duration `envconfig:"GRACE" default:"25s"`
	// LogLevel is debug, info, warn or error; LogFormat text or json.
	LogLevel  string `envconfig:"LOG_LEVEL" default:"info"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"text"`
}

// webhook is the webhook service's configuration from the environment.
func (c Config) webhook() webhook.Config {
	return webhook.Config{
		Secret: []byte(c.WebhookSecret), AllowHosts: webhook.Hosts(c.WebhookAllowHosts), AllowPrivate: c.WebhookAllowPrivate,
		MaxAttempts: c.WebhookMaxAttempts, BackoffBase: c.WebhookBackoff, BackoffMax: c.WebhookBackoffMax, Timeout: c.WebhookTimeout,
	}
}

// serviceConcurrency is the per-service concurrency set in the environment.
func (c Config) serviceConcurrency() map[string]int {
	return map[string]int{
		"intake": c.IntakeConcurrency, "verifier": c.VerifierConcurrency, "gate": c.GateConcurrency,
		"prompt": c.PromptConcurrency, "executor": c.ExecutorConcurrency, "recorder": c.RecorderConcurrency,
	}
}

// maxTypeLabels is DISPATCH_METRICS_TYPE_LABELS as mesh.Options takes it:
// 0 there is the default, negative none.
func (c Config) maxTypeLabels() int {
	if c.MetricsTypeLabels == 0 {
		return -1
	}
	return c.MetricsTypeLabels
}

// stateKey is DISPATCH_STATE_KEY decoded (nil when unset).
func (c Config) stateKey() ([]byte, error) {
	if c.StateKey == "" {
		return nil, nil
	}
	key, err := base64.StdEncoding.DecodeString(c.StateKey)
	if err != nil {
		return nil, fmt.Errorf("DISPATCH_STATE_KEY must be base64 (e.g. openssl rand -base64 32): %w", err)
	}
	if len(key) < services.MinStateKey {
		return nil, fmt.Errorf("DISPATCH_STATE_KEY must decode to at least %d bytes, got %d", services.MinStateKey, len(key))
	}
	return key, nil
}

func loadConfig() (Config, error) {
	var c Config
	if err := envconfig.Process("dispatch", &c); err != nil {
		return c, err
	}
	url, err := resolveNATSURL(os.LookupEnv)
	if err != nil {
		return c, err
	}
	c.NATSURL = url
	return c, c.Validate()
}

// DefaultNATSURL is where clients connect when neither NATS_URL nor
// DISPATCH_NATS_URL is set.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// resolveNATSURL is where to connect: NATS_URL, the variable every NATS client
// reads (the nats CLI, nats.js, nats.c, the examples), or
// DISPATCH_NATS_URL, this command's older name, still honoured. Both set
// to different URLs is an error rather than a silent choice: one of them
// is stale.
func resolveNATSURL(lookup func(string) (string, bool)) (string, error) {
	plain, _ := lookup("NATS_URL")
	old, _ := lookup("DISPATCH_NATS_URL")
	plain, old = strings.TrimSpace(plain), strings.TrimSpace(old)
	if plain != "" && old != "" && plain != old {
		return "", fmt.Errorf("NATS_URL=%s and DISPATCH_NATS_URL=%s differ: unset one (NATS_URL is the name every NATS client reads)", plain, old)
	}
	if plain != "" {
		return plain, nil
	}
	if old != "" {
		return old, nil
	}
	return DefaultNATSURL, nil
}

// Validate reports every problem at once.
// circuit is the executor's per-model breaker configuration.
func (c Config) circuit() executor.CircuitConfig {
	return executor.CircuitConfig{Threshold: c.ModelFailures, Window: c.ModelWindow, CoolDown: c.ModelCoolDown, MaxCoolDown: c.ModelMaxCoolDown, DeadFor: c.ModelDeadFor}
}

func (c Config) Validate() error {
	var errs []error
	if c.ModelFailures == 0 || c.ModelWindow < 0 || c.ModelCoolDown < 0 || c.ModelMaxCoolDown < 0 || c.ModelDeadFor < 0 {
		errs = append(errs, errors.New("DISPATCH_MODEL_FAILURES must be positive (or -1: no breaker) and DISPATCH_MODEL_WINDOW, _COOLDOWN, _MAX_COOLDOWN and _DEAD_FOR not negative"))
	}
	if _, err := parsePrices(c.Prices); err != nil {
		errs = append(errs, err)
	}
	if _, err := parseErrorClasses(c.ErrorClasses); err != nil {
		errs = append(errs, err)
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("DISPATCH_REPLICAS must be 1-5, got %d", c.Replicas))
	}
	for name, n := range c.serviceConcurrency() {
		if n < 0 {
			errs = append(errs, fmt.Errorf("DISPATCH_%s_CONCURRENCY must not be negative, got %d", strings.ToUpper(name), n))
		}
	}
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("DISPATCH_CONCURRENCY must not be negative, got %d", c.Concurrency))
	}
	for name, n := range map[string]int{"METRICS_TYPE_LABELS": c.MetricsTypeLabels, "API_MAX_REQUESTS": c.APIMaxRequests,
		"API_MAX_WAITS": c.APIMaxWaits, "API_MAX_CLIENT_WAITS": c.APIMaxClientWaits, "HTTP_MAX_WAITS": c.HTTPMaxWaits} {
		if n < 0 {
			errs = append(errs, fmt.Errorf("DISPATCH_%s must not be negative, got %d", name, n))
		}
	}
	if c.HTTPClientToken != "" && c.HTTPClientToken == c.HTTPToken {
		errs = append(errs, errors.New("DISPATCH_HTTP_CLIENT_TOKEN must differ from DISPATCH_HTTP_TOKEN: clients must not hold the reviewers' token"))
	}
	if _, err := c.stateKey(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.agentLimits(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.commandLimits(); err != nil {
		errs = append(errs, err)
	}
	if c.AckWait <= 0 {
		errs = append(errs, fmt.Errorf("DISPATCH_ACK_WAIT must be positive, got %s", c.AckWait))
	}
	if c.Grace < 0 {
		errs = append(errs, fmt.Errorf("DISPATCH_GRACE must not be negative, got %s", c.Grace))
	}
	if c.MaxDeliver < 2 {
		errs = append(errs, fmt.Errorf("DISPATCH_MAX_DELIVER must be at least 2, got %d", c.MaxDeliver))
	}
	if c.Duplicates > c.MaxAge {
		errs = append(errs, fmt.Errorf("DISPATCH_DUPLICATES (%s) must not exceed DISPATCH_MAX_AGE (%s)", c.Duplicates, c.MaxAge))
	}
	for name, v := range map[string]string{"STREAM_MAX_BYTES": c.StreamMaxBytes, "SUBMIT_MAX_BYTES": c.SubmitMaxBytes} {
		if _, err := streamBytes(name, v); err != nil {
			errs = append(errs, err)
		}
	}
	if c.SubmitDuplicates <= 0 || c.SubmitDuplicates > c.MaxAge {
		errs = append(errs, fmt.Errorf("DISPATCH_SUBMIT_DUPLICATES must be positive and not exceed DISPATCH_MAX_AGE (%s), got %s", c.MaxAge, c.SubmitDuplicates))
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("DISPATCH_LOG_FORMAT must be text or json, got %q", c.LogFormat))
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		errs = append(errs, fmt.Errorf("DISPATCH_LOG_LEVEL: %w", err))
	}
	return errors.Join(errs...)
}

// agentLimits are DISPATCH_AGENT_CPU, _MEMORY and _FILES.
func (c Config) agentLimits() (procgroup.Limits, error) {
	return parseLimits("AGENT", c.AgentCPU, c.AgentMemory, c.AgentFiles)
}

// commandLimits are DISPATCH_COMMAND_CPU, _MEMORY and _FILES.
func (c Config) commandLimits() (procgroup.Limits, error) {
	return parseLimits("COMMAND", c.CommandCPU, c.CommandMemory, c.CommandFiles)
}

// parseLimits reads DISPATCH_<kind>_CPU, _MEMORY and _FILES; "0" and "off"
// are unlimited (0).
func parseLimits(kind, cpu, memory, files string) (procgroup.Limits, error) {
	var lim procgroup.Limits
	var errs []error
	bad := func(name, value, want string) {
		errs = append(errs, fmt.Errorf("DISPATCH_%s_%s: %q is not %s, 0 or off (unlimited)", kind, name, value, want))
	}
	off := func(v string) bool { return v == "0" || strings.EqualFold(v, "off") }
	if cpu = strings.TrimSpace(cpu); !off(cpu) {
		d, err := time.ParseDuration(cpu)
		if err != nil || d < 0 {
			bad("CPU", cpu, "a duration (10m)")
		}
		lim.CPU = max(d, 0)
	}
	if memory = strings.TrimSpace(memory); !off(memory) {
		n, err := parseBytes(memory)
		if err != nil {
			bad("MEMORY", memory, "bytes or a number of KiB, MiB, GiB or TiB (4GiB)")
		}
		lim.Memory = n
	}
	if files = strings.TrimSpace(files); !off(files) {
		n, err := strconv.Atoi(files)
		if err != nil || n < 0 {
			bad("FILES", files, "a number of files (1024)")
		}
		lim.Files = max(n, 0)
	}
	return lim, errors.Join(errs...)
}

// parseBytes reads "4096", "512MiB", "4GiB": a whole number of bytes, KiB,
// MiB, GiB or TiB.
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}}
	num, shift := s, uint(0)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, shift = strings.TrimSpace(n), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%q is not a size in bytes", s)
	}
	return n << shift, nil
}

// Price is USD per million tokens.
type Price struct{ In, Out float64 }

func parsePrices(s string) (map[string]Price, error) {
	prices := map[string]Price{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		model, pair, ok := strings.Cut(item, "=")
		in, out, ok2 := strings.Cut(pair, "/")
		pin, err1 := strconv.ParseFloat(in, 64)
		pout, err2 := strconv.ParseFloat(out, 64)
		if !ok || !ok2 || err1 != nil || err2 != nil || model == "" {
			return nil, fmt.Errorf("DISPATCH_PRICES: %q is not model=input/output (USD per million tokens)", item)
		}
		if !(pin >= 0 && pout >= 0) || math.IsInf(pin, 0) || math.IsInf(pout, 0) { // NaN fails >= too
			return nil, fmt.Errorf("DISPATCH_PRICES: %q: a price must be a finite number of USD, not negative", item)
		}
		prices[model] = Price{pin, pout}
	}
	return prices, nil
}

func (c Config) logger() *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// connect opens a connection to NATS_URL (or url) named name:
// client commands connect as "client", the web page as "web", a service as
// itself — the user names deploy/ grants permissions to.
func (c Config) connect(url, name string) (*nats.Conn, error) {
	if url == "" {
		url = c.NATSURL
	}
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1)}
	user, password := c.NATSUser, c.NATSPassword
	if user == "" && c.NATSCreds == "" {
		// The login every NATS client reads (the nats CLI, the examples),
		// as up's banner prints it for a login-protected server.
		user, password = os.Getenv("NATS_USER"), os.Getenv("NATS_PASSWORD")
	}
	switch {
	case c.NATSCreds != "":
		opts = append(opts, nats.UserCredentials(c.NATSCreds))
	case user != "":
		opts = append(opts, nats.UserInfo(user, password))
	}
	if c.NATSCA != "" {
		opts = append(opts, nats.RootCAs(c.NATSCA))
	}
	// Replies come to _INBOX.<user>.>: the per-service users of deploy/ may
	// subscribe only there.
	inbox := name
	if user != "" {
		inbox = user
	}
	opts = append(opts, nats.CustomInboxPrefix("_INBOX."+inbox))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w (is the mesh up? run `dispatch up`)", url, err)
	}
	return nc, nil
}

// parseErrorClasses reads DISPATCH_ERROR_CLASSES: "409=transient,418=deterministic".
func parseErrorClasses(s string) (map[int]events.ErrorClass, error) {
	m := map[int]events.ErrorClass{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		code, name, ok := strings.Cut(item, "=")
		n, err := strconv.Atoi(strings.TrimSpace(code))
		class := events.ErrorClass(strings.TrimSpace(name))
		switch class {
		case events.ErrorClassTransient, events.ErrorClassDeterministic, events.ErrorClassAuth,
			events.ErrorClassQuota, events.ErrorClassConfig:
		default:
			ok = false
		}
		if !ok || err != nil || n < 100 || n > 999 {
			return nil, fmt.Errorf("DISPATCH_ERROR_CLASSES: %q is not code=class (transient, deterministic, auth, quota, config)", item)
		}
		m[n] = class
	}
	return m, nil
}

// errorRules is how the executor classifies errors: DISPATCH_ERROR_CLASSES,
// and the built-in body markers plus those DISPATCH_QUOTA_BODY,
// DISPATCH_RATE_LIMIT_BODY and DISPATCH_CONTEXT_LENGTH_BODY add.
func (c Config) errorRules() executor.Rules {
	classes, _ := parseErrorClasses(c.ErrorClasses) // validated with the config
	return executor.Rules{Status: classes,
		QuotaBody:         withBuiltIn(executor.DefaultQuotaBody, c.QuotaBody),
		RateLimitBody:     withBuiltIn(executor.DefaultRateLimitBody, c.RateLimitBody),
		ContextLengthBody: withBuiltIn(executor.DefaultContextLengthBody, c.ContextLengthBody)}
}

// withBuiltIn is the built-in markers plus extra; nil (the built-in
// markers) without extra.
func withBuiltIn(builtIn, extra []string) []string {
	if len(extra) == 0 {
		return nil
	}
	return append(slices.Clone(builtIn), extra...)
}

// streamConfig is what provisioning creates, from the environment.
func (c Config) streamConfig() services.StreamConfig {
	events, _ := streamBytes("STREAM_MAX_BYTES", c.StreamMaxBytes) // checked by Validate
	submit, _ := streamBytes("SUBMIT_MAX_BYTES", c.SubmitMaxBytes)
	return services.StreamConfig{MaxAge: c.MaxAge, Duplicates: c.Duplicates, SubmitDuplicates: c.SubmitDuplicates, Replicas: c.Replicas,
		MaxBytes: events, SubmitMaxBytes: submit}
}

// streamBytes reads DISPATCH_<name>, a stream's size: bytes, KiB … TiB,
// or "0" and "off" for unlimited (0).
func streamBytes(name, v string) (int64, error) {
	if v = strings.TrimSpace(v); v == "0" || strings.EqualFold(v, "off") {
		return 0, nil
	}
	n, err := parseBytes(v)
	if err != nil {
		return 0, fmt.Errorf("DISPATCH_%s: %q is not bytes or a number of KiB, MiB, GiB or TiB (12GiB), 0 or off (unlimited)", name, v)
	}
	return n, nil
}
