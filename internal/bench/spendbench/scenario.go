package spendbench

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/http"
	"strings"
)

// Scenario names. Each is also the task type of the tasks that follow it, so
// the mesh sees one type per behaviour, as it would see one type per kind of
// work in production.
const (
	// Healthy succeeds at once.
	Healthy = "healthy"
	// Flaky: for about half the tickets (a hash of the ticket) the first call
	// gets a 503; every later call succeeds.
	Flaky = "flaky"
	// RateLimited: the first call gets a 429 rate_limit_exceeded with
	// Retry-After: 1; every later call succeeds.
	RateLimited = "ratelimited"
	// Fixable: a 400 invalid_request_error naming a fix token (FIX-<ticket>)
	// unless the request contains that token, then success. A client that
	// carries the provider's error into the next request resolves it.
	Fixable = "fixable"
	// History: a billed failure answer whose summary names a hint
	// (HINT-<ticket>) unless the request contains that hint, then success.
	// A client that carries the previous attempt's outcome into the next
	// request resolves it.
	History = "history"
	// Pivot: a billed failure answer declaring the approach PIVOT-<ticket>
	// unless the request lists that approach as a dead end (it contains the
	// approach and the words "dead end"), then success. A client that tells
	// the model which approach failed and asks for another resolves it;
	// adjusting the same approach does not.
	Pivot = "pivot"
	// Hopeless: always a billed failure answer.
	Hopeless = "hopeless"
	// BadKey: always 401 invalid_api_key (free).
	BadKey = "badkey"
	// Quota: always 429 insufficient_quota (free).
	Quota = "quota"
	// Coinflip: a billed answer that succeeds with probability 1/2, decided
	// by a hash of the ticket and the index of this ticket's billed call.
	Coinflip = "coinflip"
)

// Scenarios lists every scenario, in report order.
var Scenarios = []string{Healthy, Flaky, RateLimited, Fixable, History, Pivot, Coinflip, Hopeless, BadKey, Quota}

// Share is a scenario's share of a workload, in percent.
type Share struct {
	Scenario string  `json:"scenario"`
	Percent  float64 `json:"percent"`
}

// DefaultMix is the workload's composition: 52 % that any client resolves
// (healthy, flaky, rate-limited, coinflip mostly), 26 % that only a client
// carrying what happened before resolves (fixable, history, pivot), 22 %
// that no retry resolves (hopeless, bad key, exhausted quota).
var DefaultMix = []Share{
	{Healthy, 26}, {Flaky, 12}, {RateLimited, 6}, {Fixable, 10}, {History, 10},
	{Pivot, 6}, {Coinflip, 8}, {Hopeless, 15}, {BadKey, 4}, {Quota, 3},
}

// SteadyMix is the steady stream's composition: DefaultMix's eight
// behaviours that a model answers (no bad key, no exhausted quota).
var SteadyMix = []Share{
	{Healthy, 28}, {Flaky, 12}, {RateLimited, 6}, {Fixable, 10}, {History, 12},
	{Pivot, 8}, {Coinflip, 9}, {Hopeless, 15},
}

// BatchMix is the small mixed batch: 42 tasks of 9 behaviours (the shares
// are the counts).
var BatchMix = []Share{
	{Healthy, 6}, {Flaky, 5}, {RateLimited, 4}, {Fixable, 5}, {History, 5},
	{Pivot, 4}, {Coinflip, 5}, {Hopeless, 5}, {BadKey, 3},
}

// NeedsCarryOver reports whether a scenario is resolved only by a request
// that carries something from an earlier call (the provider's error or the
// previous outcome): what a stateless loop cannot do.
func NeedsCarryOver(scenario string) bool {
	return scenario == Fixable || scenario == History || scenario == Pivot
}

// Resolvable reports whether some client can resolve tasks of the scenario.
func Resolvable(scenario string) bool {
	switch scenario {
	case Hopeless, BadKey, Quota:
		return false
	}
	return true
}

// call kinds, as the ledger records them.
const (
	kindSuccess   = "success"   // 200, a success result
	kindFailure   = "failure"   // 200, a failure result (billed)
	kindTransient = "transient" // 503, 429 rate limit: free, retry later
	kindInvalid   = "invalid"   // 400: free, deterministic
	kindAuth      = "auth"      // 401: free
	kindQuota     = "quota"     // 429 insufficient_quota: free
	kindUnknown   = "unknown"   // no ticket or scenario found in the request: 400
)

// answer is what the server replies to one call.
type answer struct {
	kind    string
	status  int
	content string // the assistant message of a 200 answer
	body    string // the error body of any other answer
	header  http.Header
	// tokensIn and tokensOut are the usage a 200 answer reports.
	tokensIn, tokensOut int
}

// prior is what the server remembers of a ticket's earlier calls when it
// decides the next answer.
type prior struct {
	calls  int // every earlier call
	billed int // earlier 200 answers
}

// decide is the scenario's answer to a request whose message contents are
// content, given the ticket's earlier calls. It depends on nothing else.
func decide(scenario, ticket, content string, p prior) answer {
	switch scenario {
	case Healthy:
		return success(scenario, ticket)
	case Flaky:
		if p.calls == 0 && hash(ticket, 0)%2 == 0 {
			return apiError(kindTransient, http.StatusServiceUnavailable, "server_error", "", "The server is overloaded or not ready yet.", nil)
		}
		return success(scenario, ticket)
	case RateLimited:
		if p.calls == 0 {
			return apiError(kindTransient, http.StatusTooManyRequests, "requests", "rate_limit_exceeded",
				"Rate limit reached for requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 1s.",
				http.Header{"Retry-After": {"1"}})
		}
		return success(scenario, ticket)
	case Fixable:
		if !strings.Contains(content, fixToken(ticket)) {
			return apiError(kindInvalid, http.StatusBadRequest, "invalid_request_error", "invalid_value",
				fmt.Sprintf("payload field 'selector' is invalid: use a class selector [%s]", fixToken(ticket)), nil)
		}
		return success(scenario, ticket)
	case History:
		if !strings.Contains(content, hintToken(ticket)) {
			return failure(fmt.Sprintf("patch the request handler (try %d)", p.billed+1),
				fmt.Sprintf("the handler was not the cause; the crash comes from a stale cache entry in the loader, look there first (%s)", hintToken(ticket)))
		}
		return success(scenario, ticket)
	case Pivot:
		if !strings.Contains(content, pivotToken(ticket)) || !strings.Contains(strings.ToLower(strings.ReplaceAll(content, "_", " ")), "dead end") {
			return failure(fmt.Sprintf("patch the parser in place (%s)", pivotToken(ticket)),
				fmt.Sprintf("the parser still rejects the input (try %d)", p.billed+1))
		}
		return success(scenario, ticket)
	case Hopeless:
		return failure(fmt.Sprintf("rework the module, variant %d", p.billed+1),
			fmt.Sprintf("the upstream dependency is broken; nothing in this repository fixes it (try %d)", p.billed+1))
	case BadKey:
		return apiError(kindAuth, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
			"Incorrect API key provided: sk-spend****. You can find your API key at https://platform.openai.com/account/api-keys.", nil)
	case Quota:
		return apiError(kindQuota, http.StatusTooManyRequests, "insufficient_quota", "insufficient_quota",
			"You exceeded your current quota, please check your plan and billing details.", nil)
	case Coinflip:
		if hash(ticket, p.billed)%2 == 0 {
			return success(scenario, ticket)
		}
		return failure(fmt.Sprintf("stabilise the timing, variant %d", p.billed+1),
			fmt.Sprintf("the test still fails intermittently after the change (try %d)", p.billed+1))
	}
	return apiError(kindUnknown, http.StatusBadRequest, "invalid_request_error", "", "spendbench: unknown scenario "+scenario, nil)
}

func fixToken(ticket string) string   { return "FIX-" + ticket }
func hintToken(ticket string) string  { return "HINT-" + ticket }
func pivotToken(ticket string) string { return "PIVOT-" + ticket }

// hash is a stable hash of a ticket and a number, every bit of it
// independent of the others' (FNV's low bit, for one, is only the parity
// of the input bytes: n and n+1 would always land on opposite sides).
func hash(ticket string, n int) uint32 {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", ticket, n))
	return binary.BigEndian.Uint32(sum[:4])
}

func success(scenario, ticket string) answer {
	return answer{kind: kindSuccess, status: http.StatusOK, content: fmt.Sprintf(
		`{"status":"success","approach":"apply the %s fix","summary":"the problem of %s is fixed and the checks pass","changes":["edited the affected file","added a regression test"]}`,
		scenario, ticket)}
}

func failure(approach, summary string) answer {
	return answer{kind: kindFailure, status: http.StatusOK, content: fmt.Sprintf(
		`{"status":"failure","approach":%q,"summary":%q,"changes":[]}`, approach, summary)}
}

func apiError(kind string, status int, typ, code, message string, header http.Header) answer {
	codeJSON := "null"
	if code != "" {
		codeJSON = fmt.Sprintf("%q", code)
	}
	return answer{kind: kind, status: status, header: header, body: fmt.Sprintf(
		`{"error":{"message":%q,"type":%q,"param":null,"code":%s}}`, message, typ, codeJSON)}
}
