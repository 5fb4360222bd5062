package intake

import (
	"context"
	"fmt"
	"maps"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// The API's bounds, per instance, when its fields leave them unset.
const (
	// DefaultMaxRequests is API.MaxRequests when unset. A submit or status
	// is a few round trips to the server (≈ 1 ms each): 128 at once is more
	// than one server stores, so only a flood or a stalled server meets it.
	DefaultMaxRequests = 128
	// DefaultMaxWaits is API.MaxWaits when unset.
	DefaultMaxWaits = 1024
	// DefaultMaxClientWaits is API.MaxClientWaits when unset: one client
	// holds at most 1/16 of DefaultMaxWaits.
	DefaultMaxClientWaits = 64
)

// Refusal is why a request was answered 503 without being served.
type Refusal string

// The refusals, each counted in the endpoint's EndpointLoad.
const (
	// RefusedStopping: Stop was called (or Start was not).
	RefusedStopping Refusal = "stopping"
	// RefusedBusy: MaxRequests submit and status requests in progress.
	RefusedBusy Refusal = "busy"
	// RefusedWaits: MaxWaits waits and watches held.
	RefusedWaits Refusal = "waits"
	// RefusedClientWaits: the requesting client holds MaxClientWaits.
	RefusedClientWaits Refusal = "client_waits"
)

// EndpointLoad is what one endpoint holds and has refused since Start: the
// data of its micro STATS (`nats micro stats dispatch`). Every key is from
// a fixed set.
type EndpointLoad struct {
	// InFlight is how many of its requests are being served (a wait or a
	// watch: held).
	InFlight int `json:"in_flight"`
	// Refused counts its requests answered 503 without being served, by
	// reason.
	Refused map[Refusal]uint64 `json:"refused"`
	// Errors counts its error answers by code (events.Code*), refusals
	// included. Micro's own num_errors sees none of them: they are sent
	// after its handler returned.
	Errors map[string]uint64 `json:"errors"`
}

// Load is each endpoint's load (submit, status, wait, watch), a copy.
func (a *API) Load() map[string]EndpointLoad {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]EndpointLoad, len(a.load))
	for name := range a.load {
		out[name] = a.loadCopy(name)
	}
	return out
}

// loadCopy is a copy of endpoint's load. Call with a.mu held.
func (a *API) loadCopy(endpoint string) EndpointLoad {
	l := a.loadOf(endpoint)
	return EndpointLoad{InFlight: l.InFlight, Refused: maps.Clone(l.Refused), Errors: maps.Clone(l.Errors)}
}

// statsData is the data of endpoint e's micro STATS: its load.
func (a *API) statsData(e *micro.Endpoint) any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.loadCopy(e.Name)
}

// loadOf is endpoint's load. Call with a.mu held.
func (a *API) loadOf(endpoint string) *EndpointLoad {
	if a.load == nil {
		a.load = map[string]*EndpointLoad{}
	}
	l := a.load[endpoint]
	if l == nil {
		l = &EndpointLoad{Refused: map[Refusal]uint64{}, Errors: map[string]uint64{}}
		a.load[endpoint] = l
	}
	return l
}

// counted counts an error answer of endpoint.
func (a *API) counted(endpoint string, code int) {
	a.mu.Lock()
	a.loadOf(endpoint).Errors[strconv.Itoa(code)]++
	a.mu.Unlock()
}

// serve is the micro handler of a request answered at once (submit,
// status): served on a goroutine of its own, at most MaxRequests at once.
// The handler only admits it: a micro endpoint's handler runs on its
// subscription's one goroutine.
func (a *API) serve(endpoint string, h func(*request)) micro.HandlerFunc {
	return func(req micro.Request) {
		if !a.inbox(req) {
			return
		}
		r := &request{endpoint: endpoint, data: req.Data(), reply: req.Reply(), header: nats.Header(req.Headers())}
		_, done, err := a.admit(endpoint, "", false)
		if err != nil {
			a.answer(r, nil, err)
			return
		}
		go a.run(r, done, func() { h(r) })
	}
}

// hold is the micro handler of a request that holds on (a wait, a watch):
// served on a goroutine of its own, at most MaxWaits at once and
// MaxClientWaits per client, under a context Stop ends. An invalid request
// is answered at once.
func (a *API) hold(endpoint string, h func(context.Context, *request, events.TaskRequest)) micro.HandlerFunc {
	return func(req micro.Request) {
		if !a.inbox(req) {
			return
		}
		r := &request{endpoint: endpoint, data: req.Data(), reply: req.Reply()}
		tr, err := events.DecodeTaskRequest(r.data)
		if err != nil {
			a.answer(r, nil, err)
			return
		}
		ctx, done, err := a.admit(endpoint, ClientOf(r.reply), true)
		if err != nil {
			a.answer(r, nil, err)
			return
		}
		go a.run(r, done, func() { h(ctx, r, tr) })
	}
}

// run serves r and then gives its place back. A panic is logged and, when
// r was not answered yet, answered 500: every request admitted is answered.
func (a *API) run(r *request, done func(), serve func()) {
	defer done()
	defer func() {
		if p := recover(); p != nil {
			a.log().Error("API request panicked", "endpoint", r.endpoint, "panic", p, "stack", string(debug.Stack()))
			if !r.answered {
				a.answer(r, nil, fmt.Errorf("the service failed serving the request (%s)", r.endpoint))
			}
		}
	}()
	serve()
}

// admit takes a place for a request of endpoint: one of MaxRequests, or
// for one that holds on (a wait, a watch) one of MaxWaits and of the
// client's MaxClientWaits. It returns the context to serve it under (Stop
// ends it) and done, to call once it is answered; or, past a bound or once
// Stop was called, the 503 to answer, counted.
func (a *API) admit(endpoint, client string, holds bool) (context.Context, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	load := a.loadOf(endpoint)
	refuse := func(why Refusal, message string) (context.Context, func(), error) {
		load.Refused[why]++
		return nil, nil, events.NewAPIError(events.CodeUnavailable, message)
	}
	maxRequests, maxWaits, maxClient := orDefault(a.MaxRequests, DefaultMaxRequests),
		orDefault(a.MaxWaits, DefaultMaxWaits), orDefault(a.MaxClientWaits, DefaultMaxClientWaits)
	switch {
	case a.ctx == nil || a.ctx.Err() != nil:
		// Set under a.mu before Stop waits: nothing is admitted once it does.
		return refuse(RefusedStopping, "the service is stopping: ask again")
	case !holds && a.requests >= maxRequests:
		return refuse(RefusedBusy, fmt.Sprintf("busy: %d requests in progress, this instance's limit: ask again", maxRequests))
	case holds && a.waiting >= maxWaits:
		return refuse(RefusedWaits, fmt.Sprintf("busy: %d waits and watches in progress, this instance's limit: ask again", maxWaits))
	case holds && a.clients[client] >= maxClient:
		return refuse(RefusedClientWaits, fmt.Sprintf("this client (%s) already holds %d waits and watches, the limit per client: ask again once one has ended", client, maxClient))
	}
	if holds {
		if a.clients == nil {
			a.clients = map[string]int{}
		}
		a.waiting++
		a.clients[client]++
	} else {
		a.requests++
	}
	load.InFlight++
	a.inflight.Add(1)
	return a.ctx, func() {
		a.mu.Lock()
		if holds {
			a.waiting--
			if a.clients[client]--; a.clients[client] <= 0 {
				delete(a.clients, client)
			}
		} else {
			a.requests--
		}
		load.InFlight--
		a.mu.Unlock()
		a.inflight.Done()
	}, nil
}

func orDefault(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// nuidLen and nuidPrefixLen: a NUID (github.com/nats-io/nuid, the same
// scheme in every official NATS client) is 22 base-62 characters, a
// 12-character prefix drawn at random once per generator — one per
// process in nats.go's NewInbox — then a sequence.
const (
	nuidLen       = 22
	nuidPrefixLen = 12
)

// ClientOf names the client a request comes from, by its reply subject:
// the subject without its last token, which is what one requester keeps
// from one request to the next.
//
//   - nats.go's Request (and the nats CLI's) replies to
//     <inbox prefix>.<NUID of the connection>.<8-character token>: the
//     client is the connection, _INBOX.<NUID> (or _INBOX.client.<NUID>
//     under a custom inbox prefix).
//   - A per-request inbox — nats.NewInbox, nc.NewInbox (what a watch
//     subscribes to), old-style requests — ends with a fresh NUID: the
//     client is what comes before it plus the NUID's prefix, which is the
//     same for every inbox one process makes: _INBOX.<prefix> (or
//     _INBOX.client.<prefix>), the process.
//   - Any other reply is its subject without its last token: _INBOX.x and
//     _INBOX.y are one client, _INBOX.
//
// A requester chooses its reply subject (within its inbox permissions), so
// this is fairness between well-behaved clients, not a defence: one that
// makes up a new subject per request is bounded only by MaxWaits.
func ClientOf(reply string) string {
	i := strings.LastIndexByte(reply, '.')
	if i < 0 {
		return reply
	}
	rest, last := reply[:i], reply[i+1:]
	if isNUID(last) {
		return rest + "." + last[:nuidPrefixLen]
	}
	return rest
}

func isNUID(s string) bool {
	if len(s) != nuidLen {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}
