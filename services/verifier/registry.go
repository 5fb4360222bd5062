package verifier

import (
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// factory builds the Checker of one verifier policy.
type factory func(v policy.Verifier) (Checker, error)

// registry maps each verifier kind to its factory.
func (s *Service) registry() map[string]factory {
	return map[string]factory{
		policy.VerifierNone: func(policy.Verifier) (Checker, error) { return None{}, nil },
		policy.VerifierNATS: func(v policy.Verifier) (Checker, error) {
			if s.cfg.NC == nil {
				return nil, ErrNoConn
			}
			return &NATS{NC: s.cfg.NC, Subject: v.Subject, Timeout: time.Duration(v.Timeout)}, nil
		},
		policy.VerifierHTTP: func(v policy.Verifier) (Checker, error) {
			return &HTTP{Client: s.cfg.HTTPClient, URL: v.URL, Timeout: time.Duration(v.Timeout)}, nil
		},
		policy.VerifierCommand: func(v policy.Verifier) (Checker, error) {
			return &Command{Argv: v.Command, Env: s.cfg.CommandEnv, Limits: s.cfg.CommandLimits, Timeout: time.Duration(v.Timeout)}, nil
		},
	}
}

// kind is v's kind, "" read as none.
func kind(v policy.Verifier) string {
	if v.Kind == "" {
		return policy.VerifierNone
	}
	return v.Kind
}

// CheckerFor builds the Checker a verifier policy names. An unknown kind
// wraps ErrUnknownKind; a nats verifier without a connection is ErrNoConn.
func (s *Service) CheckerFor(v policy.Verifier) (Checker, error) {
	f, ok := s.kinds[kind(v)]
	if !ok {
		return nil, fmt.Errorf("%w %q (none, nats, http, command)", ErrUnknownKind, v.Kind)
	}
	return f(v)
}
