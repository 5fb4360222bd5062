package main

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/procgroup"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

func TestParseErrorClasses(t *testing.T) {
	m, err := parseErrorClasses(" 409=transient, 418=deterministic ,413=config")
	if err != nil || m[409] != "transient" || m[418] != "deterministic" || m[413] != "config" || len(m) != 3 {
		t.Fatalf("got %v, %v", m, err)
	}
	for _, bad := range []string{"409", "409=maybe", "x=transient", "42=auth"} {
		if _, err := parseErrorClasses(bad); err == nil || !strings.Contains(err.Error(), "DISPATCH_ERROR_CLASSES") {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}

func TestParsePrices(t *testing.T) {
	p, err := parsePrices("gpt-4o=2.5/10, local=0/0")
	if err != nil || p["gpt-4o"].In != 2.5 || p["gpt-4o"].Out != 10 || len(p) != 2 {
		t.Fatalf("got %v, %v", p, err)
	}
	for _, bad := range []string{"gpt-4o=2.5", "gpt-4o=-1/10", "gpt-4o=NaN/1", "gpt-4o=1/+Inf"} {
		if _, err := parsePrices(bad); err == nil || !strings.Contains(err.Error(), "DISPATCH_PRICES") {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}

// loadConfig refuses durations that would make no sense, with every
// problem named.
func TestConfigRefusesBadDurations(t *testing.T) {
	t.Setenv("DISPATCH_ACK_WAIT", "0s")
	t.Setenv("DISPATCH_GRACE", "-1s")
	_, err := loadConfig()
	for _, want := range []string{"DISPATCH_ACK_WAIT must be positive", "DISPATCH_GRACE must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// DISPATCH_QUOTA_BODY, DISPATCH_RATE_LIMIT_BODY and
// DISPATCH_CONTEXT_LENGTH_BODY add markers to the built-in ones: naming a
// provider's own wording never unlearns OpenAI's.
func TestErrorBodiesAddToTheBuiltIn(t *testing.T) {
	t.Setenv("DISPATCH_QUOTA_BODY", "monthly")
	t.Setenv("DISPATCH_RATE_LIMIT_BODY", "slow down please")
	t.Setenv("DISPATCH_CONTEXT_LENGTH_BODY", "prompt is too long")
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	rules := cfg.errorRules()
	if unset := (Config{}).errorRules(); unset.QuotaBody != nil || unset.RateLimitBody != nil || unset.ContextLengthBody != nil {
		t.Errorf("unset: %+v, want nil markers (the built-in ones)", unset)
	}
	answer := func(status int, body string) error {
		return &executor.ProviderError{Model: "gpt-4o", StatusCode: status,
			Err: &openai.RequestError{HTTPStatusCode: status, Body: []byte(body), Err: errors.New("error status")}}
	}
	for _, tt := range []struct {
		name   string
		status int
		body   string
		class  events.ErrorClass
	}{
		{"built-in quota", 429, `{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}`, events.ErrorClassQuota},
		{"added quota", 429, "the monthly allowance is spent", events.ErrorClassQuota},
		{"built-in rate limit", 429, "rate_limit_exceeded on the monthly plan", events.ErrorClassTransient},
		{"added rate limit", 429, "slow down please, your monthly plan is fine", events.ErrorClassTransient},
		{"built-in context length", 400, "context_length_exceeded", events.ErrorClassConfig},
		{"added context length", 400, "prompt is too long: 210000 tokens", events.ErrorClassConfig},
	} {
		if c := executor.Classify(answer(tt.status, tt.body), rules); c.Class != tt.class {
			t.Errorf("%s: %d %q is %s (%s), want %s", tt.name, tt.status, tt.body, c.Class, c.Reason, tt.class)
		}
	}
}

func TestStateKey(t *testing.T) {
	if k, err := (Config{}).stateKey(); k != nil || err != nil {
		t.Errorf("unset: %v, %v; want nothing", k, err)
	}
	good := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))
	if k, err := (Config{StateKey: good}).stateKey(); len(k) != 32 || err != nil {
		t.Errorf("32 bytes: %d bytes, %v", len(k), err)
	}
	for _, bad := range []string{"not base64!", base64.StdEncoding.EncodeToString([]byte("short"))} {
		if _, err := (Config{StateKey: bad}).stateKey(); err == nil || !strings.Contains(err.Error(), "DISPATCH_STATE_KEY") {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}

// Agent commands and command steps get procgroup.DefaultLimits unless the
// deployment sets others; "0" and "off" are unlimited; a bad value is
// refused, named.
func TestCommandLimits(t *testing.T) {
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	for kind, get := range map[string]func() (procgroup.Limits, error){"agent": cfg.agentLimits, "command": cfg.commandLimits} {
		if lim, err := get(); err != nil || lim != procgroup.DefaultLimits {
			t.Errorf("%s limits unset: %+v, %v; want procgroup.DefaultLimits %+v", kind, lim, err, procgroup.DefaultLimits)
		}
	}

	t.Setenv("DISPATCH_AGENT_CPU", "90s")
	t.Setenv("DISPATCH_AGENT_MEMORY", "512MiB")
	t.Setenv("DISPATCH_AGENT_FILES", "off")
	t.Setenv("DISPATCH_COMMAND_CPU", "0")
	t.Setenv("DISPATCH_COMMAND_MEMORY", "1048576")
	t.Setenv("DISPATCH_COMMAND_FILES", "4096")
	if cfg, err = loadConfig(); err != nil {
		t.Fatal(err)
	}
	if lim, err := cfg.agentLimits(); err != nil || lim != (procgroup.Limits{CPU: 90 * time.Second, Memory: 512 << 20}) {
		t.Errorf("agent limits %+v, %v", lim, err)
	}
	if lim, err := cfg.commandLimits(); err != nil || lim != (procgroup.Limits{Memory: 1 << 20, Files: 4096}) {
		t.Errorf("command limits %+v, %v", lim, err)
	}

	t.Setenv("DISPATCH_AGENT_CPU", "-1s")
	t.Setenv("DISPATCH_AGENT_MEMORY", "4GB")
	t.Setenv("DISPATCH_COMMAND_MEMORY", "99999999TiB")
	t.Setenv("DISPATCH_COMMAND_FILES", "many")
	_, err = loadConfig()
	for _, want := range []string{"DISPATCH_AGENT_CPU", "DISPATCH_AGENT_MEMORY", "DISPATCH_COMMAND_MEMORY", "DISPATCH_COMMAND_FILES"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %s: %v", want, err)
		}
	}
}

// DISPATCH_STREAM_MAX_BYTES and DISPATCH_SUBMIT_MAX_BYTES size the two
// streams clients fill; off (the default) is unlimited, a bad size is
// refused naming the variable.
func TestStreamMaxBytes(t *testing.T) {
	t.Setenv("DISPATCH_STREAM_MAX_BYTES", "12GiB")
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if sc := cfg.streamConfig(); sc.MaxBytes != 12<<30 || sc.SubmitMaxBytes != 0 {
		t.Fatalf("stream %d, submit %d", sc.MaxBytes, sc.SubmitMaxBytes)
	}
	t.Setenv("DISPATCH_SUBMIT_MAX_BYTES", "2 gigs")
	if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), "DISPATCH_SUBMIT_MAX_BYTES") {
		t.Fatalf("a bad size: %v", err)
	}
}

// The metric label limit, the refusal of types the policy does not name
// and the request API's bounds come from the environment; unset, they are
// the packages' defaults, and a negative one is refused, named.
func TestLimitsFromTheEnvironment(t *testing.T) {
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MetricsTypeLabels != services.DefaultMaxTypeLabels || cfg.maxTypeLabels() != services.DefaultMaxTypeLabels || cfg.KnownTypesOnly ||
		cfg.APIMaxRequests != 0 || cfg.APIMaxWaits != 0 || cfg.APIMaxClientWaits != 0 {
		t.Errorf("unset: %+v; want %d type labels, any type, the API's defaults (0)", cfg, services.DefaultMaxTypeLabels)
	}

	t.Setenv("DISPATCH_METRICS_TYPE_LABELS", "0")
	t.Setenv("DISPATCH_KNOWN_TYPES_ONLY", "true")
	t.Setenv("DISPATCH_API_MAX_REQUESTS", "16")
	t.Setenv("DISPATCH_API_MAX_WAITS", "256")
	t.Setenv("DISPATCH_API_MAX_CLIENT_WAITS", "8")
	if cfg, err = loadConfig(); err != nil {
		t.Fatal(err)
	}
	if cfg.maxTypeLabels() >= 0 || !cfg.KnownTypesOnly || cfg.APIMaxRequests != 16 || cfg.APIMaxWaits != 256 || cfg.APIMaxClientWaits != 8 {
		t.Errorf("set: %+v, type labels %d (want negative: only the named types)", cfg, cfg.maxTypeLabels())
	}

	for _, name := range []string{"DISPATCH_METRICS_TYPE_LABELS", "DISPATCH_API_MAX_REQUESTS", "DISPATCH_API_MAX_WAITS", "DISPATCH_API_MAX_CLIENT_WAITS"} {
		t.Setenv(name, "-1")
	}
	_, err = loadConfig()
	for _, want := range []string{"DISPATCH_METRICS_TYPE_LABELS", "DISPATCH_API_MAX_REQUESTS", "DISPATCH_API_MAX_WAITS", "DISPATCH_API_MAX_CLIENT_WAITS"} {
		if err == nil || !strings.Contains(err.Error(), want+" must not be negative") {
			t.Errorf("error lacks %s: %v", want, err)
		}
	}
}

// DISPATCH_MODEL_* configure the executor's per-model breaker.
func TestModelBreakerFromTheEnvironment(t *testing.T) {
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.circuit(); c.Threshold != 5 || c.Window != time.Minute || c.CoolDown != 30*time.Second || c.MaxCoolDown != 5*time.Minute || c.DeadFor != time.Hour {
		t.Errorf("defaults %+v, want 5 in 1m, 30s up to 5m, dead for 1h", c)
	}
	t.Setenv("DISPATCH_MODEL_FAILURES", "3")
	t.Setenv("DISPATCH_MODEL_COOLDOWN", "10s")
	if cfg, err = loadConfig(); err != nil {
		t.Fatal(err)
	}
	if c := cfg.circuit(); c.Threshold != 3 || c.CoolDown != 10*time.Second {
		t.Errorf("set: %+v, want 3 failures and 10s", c)
	}
	t.Setenv("DISPATCH_MODEL_FAILURES", "0")
	t.Setenv("DISPATCH_MODEL_DEAD_FOR", "-1s")
	if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), "DISPATCH_MODEL_FAILURES") {
		t.Errorf("error %v, want DISPATCH_MODEL_FAILURES refused", err)
	}
}
