package verifier

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

// Checker asks one verifier whether a task's problem still exists. It returns
// a Verification with Verdict exists or stale (skipped for kind none), or an
// error when the verifier could not answer: the Service turns that error into
// verdict error, fail-open or fail-closed as the type's policy says.
type Checker interface {
	Check(ctx context.Context, t events.Task) (events.Verification, error)
}

// DefaultTimeout bounds one check when the policy sets no timeout.
const DefaultTimeout = 10 * time.Second

// MaxDetail is the most bytes of a verifier's answer kept as the detail.
const MaxDetail = 1 << 10

// Errors a check can wrap; compare with errors.Is.
var (
	// ErrTimeout: the verifier did not answer within its timeout.
	ErrTimeout = errors.New("verifier timed out")
	// ErrBadReply: a NATS verifier's reply is not {"exists": bool, "detail": "..."}.
	ErrBadReply = errors.New("verifier reply is not valid")
	// ErrNoConn: a nats verifier is configured but the service has no NATS connection.
	ErrNoConn = errors.New("nats verifier needs a NATS connection")
	// ErrUnknownKind: the policy names a verifier kind nobody registered.
	ErrUnknownKind = errors.New("unknown verifier kind")
)

// timeout returns d, or DefaultTimeout when d is not positive.
func timeout(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultTimeout
	}
	return d
}

// checkErr classifies err from a check that ran under child, a context
// derived from parent with timeout d: the child's own deadline is ErrTimeout;
// the parent's end (shutdown) is returned as the parent's error, so the
// service naks instead of recording a verdict.
func checkErr(parent, child context.Context, d time.Duration, err error) error {
	if perr := parent.Err(); perr != nil {
		return perr
	}
	if errors.Is(child.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w after %s", ErrTimeout, d)
	}
	return err
}

// clip trims s and cuts it to at most MaxDetail bytes on a rune boundary,
// ending a cut text with "…".
func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) <= MaxDetail {
		return s
	}
	return strings.TrimSpace(textcut.Start(s, MaxDetail-len(textcut.Ellipsis))) + textcut.Ellipsis
}
