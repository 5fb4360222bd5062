package executor

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// route is one model an attempt may call: an entry of the type's model
// chain (policy models), or the one model of a type without a chain.
type route struct {
	// name labels the model in Result.Route, metrics and logs.
	name  string
	model string
	// endpoint is the API root called; identity is what of the endpoint
	// and key is part of the request's hash (Request.Endpoint): "" for
	// the executor's own endpoint and key.
	endpoint, identity string
	// keyEnv is where the key comes from, for the fix a human reads.
	keyEnv string
	// client calls the model; nil when its credential is not set.
	client Model
	// circuitKey keys the model's circuit, deadKeys the marks that stop
	// calls to it: its key refused (401, quota), its access denied (403),
	// the model not found (404).
	circuitKey string
	deadKeys   [3]string
	chain      bool
}

// The marks of deadKeys.
const (
	deadKey = iota
	deadAccess
	deadModel
)

// defaultKeyEnv is where the executor's own key comes from.
const defaultKeyEnv = "DISPATCH_OPENAI_API_KEY"

func newRoute(name, model, endpoint, identity, keyEnv, key string, client Model, chain bool) route {
	fp, at := fingerprint(key), normaliseURL(endpoint)
	return route{
		name: name, model: model, endpoint: endpoint, identity: identity, keyEnv: keyEnv, client: client, chain: chain,
		circuitKey: stateKey("circuit", at, model),
		deadKeys: [3]string{
			stateKey("dead", "key", at, fp),
			stateKey("dead", "access", at, fp, model),
			stateKey("dead", "model", at, model),
		},
	}
}

// label says what the route is, for a human reading the bucket.
func (r *route) label() string { return r.name + " (" + r.model + " at " + r.endpoint + ")" }

// markKey is the mark a failure of class with status sets: the key's for a
// refused key or a spent quota, the access's for a 403, the model's for a
// 404; "" for a fault of this request only (the context exceeded, a shape
// the endpoint does not take).
func (r *route) markKey(class events.ErrorClass, status int) string {
	switch {
	case class == events.ErrorClassQuota, class == events.ErrorClassAuth && status != 403:
		return r.deadKeys[deadKey]
	case class == events.ErrorClassAuth:
		return r.deadKeys[deadAccess]
	case class == events.ErrorClassConfig && status == 404:
		return r.deadKeys[deadModel]
	}
	return ""
}

// routes are the models the attempt may call, in order.
func (s *Service) routes(a *attempt) []route {
	chain := a.pol.Chain()
	if len(chain) == 0 {
		model := s.modelFor(a.in, a.pol)
		return []route{newRoute(model, model, s.endpoint(), "", defaultKeyEnv, s.cfg.APIKey, s.cfg.Model, false)}
	}
	own := normaliseURL(s.cfg.BaseURL)
	out := make([]route, 0, len(chain))
	for i, m := range chain {
		if m.BaseURL == "" && m.Credential == "" {
			out = append(out, newRoute(m.Name, m.Model, s.endpoint(), "", defaultKeyEnv, s.cfg.APIKey, s.cfg.Model, true))
			continue
		}
		base, key, keyEnv := own, s.cfg.APIKey, defaultKeyEnv
		if m.BaseURL != "" {
			base = normaliseURL(m.BaseURL)
		}
		var client Model
		switch {
		case m.Credential != "":
			keyEnv = policy.CredentialEnv(m.Credential)
			var ok bool
			if key, ok = s.cfg.Credential(m.Credential); ok {
				client = s.dial(base, key)
			}
		case base != own:
			// Another endpoint without a credential is called without a
			// key (a local model): the executor's own key never goes to a
			// host the policy names.
			key, keyEnv = "", "the credential of the entry (it names none: it is called without a key)"
			client = s.dial(base, key)
		default:
			client = s.dial(base, key)
		}
		r := newRoute(m.Name, m.Model, base, requestIdentity(base, key, own, s.cfg.APIKey), keyEnv, key, client, true)
		if m.BaseURL != "" {
			r.keyEnv = fmt.Sprintf("%s (models[%d] of the type's policy)", keyEnv, i)
		}
		out = append(out, r)
	}
	return out
}

// requestIdentity is what of a chain model's endpoint and key is part of
// its requests' hash: the endpoint and the key's fingerprint (never the
// credential's name: a renamed credential is the same request, a rotated
// key another), "" for the executor's own endpoint and key.
func requestIdentity(base, key, ownBase, ownKey string) string {
	if base == ownBase && key == ownKey {
		return ""
	}
	return base + "#" + fingerprint(key)
}

// normaliseURL is an API root as the hash and the marks know it: scheme
// and host lower-cased, without a trailing slash. A value that is not a
// URL is kept as it is.
func normaliseURL(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Scheme == "" || u.Host == "" {
		return raw
	}
	u.Scheme, u.Host = strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	u.Path, u.RawPath = strings.TrimRight(u.Path, "/"), strings.TrimRight(u.RawPath, "/")
	return u.String()
}

// dial is the model calling base with key, made once per endpoint and key.
func (s *Service) dial(base, key string) Model {
	id := base + "\x00" + fingerprint(key)
	s.dialMu.Lock()
	defer s.dialMu.Unlock()
	if m, ok := s.dialed[id]; ok {
		return m
	}
	if s.dialed == nil {
		s.dialed = map[string]Model{}
	}
	m := s.cfg.Dial(base, key)
	s.dialed[id] = m
	return m
}

// routeFault is a model of the chain that cannot be called: its
// deployment's fault, found now (err) or marked by an earlier call (mark).
type routeFault struct {
	route *route
	class events.ErrorClass
	fix   string
	hash  string
	err   error
	mark  *deadMark
	// keyMark says mark is its key's: it holds whatever the policy
	// revision, until the key changes.
	keyMark bool
}

// NoModelLeft is the error of a call for which every model of the chain
// is the deployment's fault: each model with what to fix.
type NoModelLeft struct {
	faults []routeFault
}

// Class is the class the attempt fails with: the first model's.
func (e *NoModelLeft) Class() events.ErrorClass { return e.faults[0].class }

func (e *NoModelLeft) Error() string {
	if len(e.faults) == 1 {
		return e.faults[0].text(false)
	}
	parts := make([]string, len(e.faults))
	for i, f := range e.faults {
		parts[i] = fmt.Sprintf("[%s] %s", f.route.name, f.text(true))
	}
	return fmt.Sprintf("deployment: none of the %d models of the type's chain can be called: %s", len(e.faults), strings.Join(parts, "; "))
}

// Unwrap is the last provider error.
func (e *NoModelLeft) Unwrap() error {
	for i := len(e.faults) - 1; i >= 0; i-- {
		if e.faults[i].err != nil {
			return e.faults[i].err
		}
	}
	return nil
}

func (f routeFault) text(short bool) string {
	switch {
	case f.mark != nil && f.keyMark:
		return fmt.Sprintf("%s (found by a call at %s; not called again with this key until %s)",
			f.fix, f.mark.At.UTC().Format(time.RFC3339), f.mark.Until.UTC().Format(time.RFC3339))
	case f.mark != nil:
		return fmt.Sprintf("%s (found by a call at %s; not called again until %s or a new policy revision)",
			f.fix, f.mark.At.UTC().Format(time.RFC3339), f.mark.Until.UTC().Format(time.RFC3339))
	case f.err != nil && !short:
		return f.fix + "; the provider said: " + errorText(f.err)
	}
	return f.fix
}

// circuitWait is the error of a call whose every model is cooling down
// (or waits for another call's probe): the task waits that long, not an
// attempt, not a transient failure.
type circuitWait struct{ wait time.Duration }

func (e *circuitWait) Error() string {
	return fmt.Sprintf("%v: every model of the type is cooling down for %s at least", ErrCircuitOpen, e.wait)
}
func (e *circuitWait) Unwrap() error { return ErrCircuitOpen }

// ledgerError is a task state write that failed during the calls: the
// message is tried again.
type ledgerError struct{ err error }

func (e *ledgerError) Error() string { return e.err.Error() }
func (e *ledgerError) Unwrap() error { return e.err }

// skip reasons (label of dispatch_model_skips_total).
const (
	skipCooling      = "cooling"       // its circuit is open
	skipDead         = "dead"          // its deployment was found wrong
	skipFailed       = "failed"        // it failed this call, transiently or by the deployment's fault
	skipRefused      = "refused"       // this request failed on it deterministically before
	skipNoCredential = "no_credential" // its credential is not set
)

// complete sends req to the first of the attempt's models that may take
// it. A model cooling down, marked dead, without its credential, or to
// which this very request failed before is passed over; one that fails
// transiently or by the deployment's fault passes the call on at once,
// without counting an attempt. It returns the answer and its request's
// hash; else the error that decides the attempt: a transient one if any
// model failed so (the task waits, a transient retry), *circuitWait if any
// is only cooling, *NoModelLeft when every model is the deployment's
// fault, errRefused when the request failed on each before; any other
// failure (a 400 of the request's own) at once.
func (a *attempt) complete(ctx context.Context, req Request) (Response, string, error) {
	var (
		transientErr          error
		transientHash, banned string
		wait                  time.Duration
		cooling               bool
		faults                []routeFault
	)
	a.passed = a.passed[:0]
	for i := range a.routes {
		rt := &a.routes[i]
		r := req
		r.Model, r.Endpoint = rt.model, rt.identity
		hash := RequestHash(r)
		resp, next, err := a.try(ctx, rt, r, hash)
		switch {
		case next == tryRefused:
			banned = hash
		case next == tryCooling:
			var cw *circuitWait
			errors.As(err, &cw)
			if !cooling || cw.wait < wait {
				wait = cw.wait
			}
			cooling = true
		case next == tryFault:
			var rf *routeFaultError
			errors.As(err, &rf)
			faults = append(faults, rf.f)
		case next == tryTransient:
			transientErr, transientHash = err, hash
		default:
			return resp, hash, err
		}
		a.passed = append(a.passed, rt.name)
	}
	a.passed = nil
	switch {
	case transientErr != nil:
		return Response{}, transientHash, transientErr
	case cooling:
		return Response{}, "", &circuitWait{wait: wait}
	case len(faults) > 0:
		// the request of the last model called (banned by fault), or
		// none: a model passed over made no request
		called := ""
		for _, f := range faults {
			if f.err != nil {
				called = f.hash
			}
		}
		return Response{}, called, &NoModelLeft{faults: faults}
	}
	return Response{}, banned, errRefused
}

// What try found of a model.
const (
	tryDone      = iota // it answered, or failed in a way that ends the call
	tryRefused          // this request failed on it before
	tryCooling          // its circuit is open
	tryFault            // the deployment's fault
	tryTransient        // it failed transiently
)

type routeFaultError struct{ f routeFault }

func (e *routeFaultError) Error() string { return e.f.fix }

// try calls one model, unless it is passed over.
func (a *attempt) try(ctx context.Context, rt *route, r Request, hash string) (Response, int, error) {
	s := a.s
	if a.f.failed[hash] || a.failedNow[hash] {
		s.metrics.skip(rt.name, skipRefused)
		return Response{}, tryRefused, nil
	}
	if rt.client == nil {
		s.metrics.skip(rt.name, skipNoCredential)
		fix := fmt.Sprintf("deployment: the credential of model %s is not set — set %s in the executor's environment", rt.name, rt.keyEnv)
		return Response{}, tryFault, &routeFaultError{routeFault{route: rt, class: events.ErrorClassAuth, fix: fix, hash: hash}}
	}
	now := s.cfg.Now()
	for i, key := range rt.deadKeys {
		// a key refused or out of quota stays so whatever the policy
		// says, for every route that holds it; a chain model's access or
		// name is the policy's to change
		if !rt.chain && i != deadKey {
			continue
		}
		if d, dead := s.models.dead(key, a.base.PolicyRev, i == deadKey, now); dead {
			s.metrics.skip(rt.name, skipDead)
			return Response{}, tryFault, &routeFaultError{routeFault{route: rt, class: d.Class, fix: d.Fix, hash: hash, mark: &d, keyMark: i == deadKey}}
		}
	}
	ok, probe, wait, state := s.models.allow(ctx, rt.circuitKey, rt.label(), now)
	s.metrics.circuitState(rt.name, state)
	if !ok {
		s.metrics.skip(rt.name, skipCooling)
		return Response{}, tryCooling, &circuitWait{wait: wait}
	}
	a.model, a.endpoint, a.route = rt.model, rt.endpoint, rt
	resp, err := complete(ctx, rt.client, r)
	if err != nil && ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keepTimeout)
		defer cancel()
		s.models.release(rctx, rt.circuitKey, rt.label(), s.cfg.Now(), probe)
		return Response{}, tryDone, ctx.Err()
	}
	c := Classify(err, s.rules)
	state, opened := s.models.done(ctx, rt.circuitKey, rt.label(), s.cfg.Now(), probe, err != nil && c.Class == events.ErrorClassTransient)
	s.metrics.called(rt.name, c.Class, state, opened)
	if opened {
		s.cfg.Log.Warn("model cooling down: its calls go to the next model of the chain", "model", rt.name, "endpoint", rt.endpoint)
	}
	switch {
	case err == nil:
		return resp, tryDone, nil
	case c.Class == events.ErrorClassTransient:
		s.metrics.skip(rt.name, skipFailed)
		return Response{}, tryTransient, err
	case !events.DeploymentFault(c.Class):
		return Response{}, tryDone, err
	}
	return a.fault(ctx, rt, hash, c, err)
}

// fault takes a model's deployment fault: the model is marked (when the
// fault is not this request's alone), the request banned for the task, and
// the call goes on to the next model. Both are written even if ctx ends
// now (shutdown): the redelivery must not call the refused key again.
func (a *attempt) fault(ctx context.Context, rt *route, hash string, c Classification, err error) (Response, int, error) {
	s := a.s
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keepTimeout)
	defer cancel()
	s.metrics.skip(rt.name, skipFailed)
	fix := s.rules.fix(c.Class, err, rt.endpoint)
	if rt.keyEnv != defaultKeyEnv {
		fix = strings.ReplaceAll(fix, defaultKeyEnv, rt.keyEnv)
	}
	if rt.chain {
		fix = strings.ReplaceAll(fix, "DISPATCH_OPENAI_BASE_URL", "the base_url of model "+rt.name+" in the type's policy")
	}
	status, _, _, _ := errorDetails(err)
	now := s.cfg.Now()
	if key := rt.markKey(c.Class, status); key != "" && (rt.chain || key == rt.deadKeys[deadKey]) {
		// marked for every task and instance: a key refused is never
		// called again, whichever type's route holds it; a model not found
		// or denied is marked for a chain (the one model of a type
		// without one fails each task after its one call, as it did)
		s.models.markDead(ctx, key, deadMark{Model: rt.label(), Class: c.Class, Fix: fix, Rev: a.base.PolicyRev, At: now, Until: now.Add(s.models.cfg.DeadFor)})
	}
	f := routeFault{route: rt, class: c.Class, fix: fix, hash: hash, err: err}
	if err := s.ledger.addFailed(ctx, a.base, a.known, hash, c.Class, f.text(false)); err != nil {
		return Response{}, tryDone, &ledgerError{err: err}
	}
	if a.failedNow == nil {
		a.failedNow = map[string]bool{}
	}
	a.failedNow[hash] = true
	a.bannedRoutes = append(a.bannedRoutes, hash+"/"+string(c.Class))
	s.cfg.Log.Warn("model is the deployment's fault: the call goes to the next model", "task", a.in.Task.ID, "model", rt.name, "class", c.Class, "fix", fix)
	return Response{}, tryFault, &routeFaultError{f}
}
