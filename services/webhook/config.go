package webhook

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// Defaults of Config.
const (
	DefaultMaxAttempts = 12
	DefaultBackoffBase = 5 * time.Second
	DefaultBackoffMax  = 15 * time.Minute
	DefaultTimeout     = 10 * time.Second
	// MinSecret is the shortest signing secret accepted, in bytes.
	MinSecret = 16
)

// Config configures the webhook service.
type Config struct {
	JS jetstream.JetStream // required
	// Secret signs every delivery (HMAC-SHA256; events.SignWebhook): the
	// service's own, from its configuration, never from a task. At least
	// MinSecret bytes. Required.
	Secret []byte
	// AllowHosts are the hosts callbacks may be delivered to (Hosts). A
	// delivery to any other is refused at once, with a review record.
	// Default none: every callback is refused.
	AllowHosts Hosts
	// AllowPrivate lets deliveries reach loopback, link-local, private and
	// other internal addresses (a receiver on the same network, tests).
	// Default false: such a connection is refused when it is dialed.
	AllowPrivate bool
	// MaxAttempts is how many times one delivery is tried before it is
	// given up (a review record, dispatch.review.webhook.<task id>).
	// Default DefaultMaxAttempts.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the delay between tries: BackoffBase
	// doubling per try up to BackoffMax, with jitter (Backoff). Defaults
	// DefaultBackoffBase and DefaultBackoffMax: 12 tries span about 40
	// minutes to an hour and a half.
	BackoffBase, BackoffMax time.Duration
	// Timeout bounds one try: connecting, sending and reading the answer.
	// Default DefaultTimeout.
	Timeout time.Duration
	// Policy names the callback URL of a type (policy.Type.CallbackURL) for
	// a task that settles without its own. Nil: only a task's own.
	Policy *policy.Source
	// Registry receives the service's metrics when set.
	Registry prometheus.Registerer
	// Instance names the service instance in logs. Log defaults to slog.Default().
	Instance string
	Log      *slog.Logger
}

// Validate joins every problem of c.
func (c Config) Validate() error {
	var errs []error
	if c.JS == nil {
		errs = append(errs, errors.New("webhook: JS is required"))
	}
	if len(c.Secret) < MinSecret {
		errs = append(errs, fmt.Errorf("webhook: the signing secret (DISPATCH_WEBHOOK_SECRET) must be at least %d bytes, is %d", MinSecret, len(c.Secret)))
	}
	if c.MaxAttempts < 0 || c.BackoffBase < 0 || c.BackoffMax < 0 || c.Timeout < 0 {
		errs = append(errs, errors.New("webhook: MaxAttempts, BackoffBase, BackoffMax and Timeout must not be negative"))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	c.BackoffMax = max(c.BackoffMax, c.BackoffBase)
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c
}
