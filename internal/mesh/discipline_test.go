package mesh_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
)

// A scripted provider mixing transient, deterministic, quota and auth
// failures: transient failures are never attempts, no request that failed
// deterministically is ever sent again, auth and quota go to a human after
// one call — and stop every later call with that key: each runs on its own
// mesh (its own endpoint and key), where a second task is not sent.
func TestErrorDiscipline(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	script := func(_ int, r openaitest.Request) openaitest.Reply {
		user := r.Messages[1].Content
		var subject string
		for _, s := range []string{"transient.go", "retry-after.go", "deterministic.go", "quota.go", "auth.go", "stubborn.go"} {
			if strings.Contains(user, s) {
				subject = s
			}
		}
		mu.Lock()
		calls[subject]++
		n := calls[subject]
		mu.Unlock()
		switch {
		case subject == "transient.go" && n <= 2:
			return openaitest.Reply{Status: http.StatusServiceUnavailable, Body: `{"error":{"message":"overloaded","type":"server_error"}}`}
		case subject == "retry-after.go" && n == 1:
			return openaitest.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}},
				Body: `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`}
		case subject == "deterministic.go" && n == 1, subject == "stubborn.go":
			return openaitest.Reply{Status: http.StatusBadRequest,
				Body: `{"error":{"message":"missing required field","type":"invalid_request_error","param":"email","code":"missing_field"}}`}
		case subject == "quota.go":
			return openaitest.Reply{Status: http.StatusTooManyRequests,
				Body: `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`}
		case subject == "auth.go":
			return openaitest.Reply{Status: http.StatusUnauthorized, Body: `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`}
		}
		return openaitest.Reply{Content: openaitest.Success("fixed " + subject)}
	}
	pol := &policy.File{Types: map[string]policy.Type{
		// A template that ignores the last error: every attempt would send the same bytes.
		"stubborn_fix": {Template: "Fix {{.Task.Subject}}.", MaxRetries: 3},
	}}
	e := newEnv(t, script, pol)
	e.start()
	for _, s := range []string{"transient.go", "retry-after.go", "deterministic.go"} {
		e.submit(events.Submit{ID: strings.TrimSuffix(strings.ReplaceAll(s, ".", "-"), "-go"), Type: "bug_fix", Subject: s})
	}
	e.submit(events.Submit{ID: "stubborn", Type: "stubborn_fix", Subject: "stubborn.go"})
	envs := map[string]*env{}
	for _, id := range []string{"quota", "auth"} {
		envs[id] = newEnv(t, script, pol)
		envs[id].start()
		envs[id].submit(events.Submit{ID: id, Type: "bug_fix", Subject: id + ".go"})
	}

	want := map[string]struct {
		end      string
		attempts int
		calls    int
	}{
		"transient":     {events.StageSucceeded, 1, 3},
		"retry-after":   {events.StageSucceeded, 1, 2},
		"deterministic": {events.StageSucceeded, 2, 2},
		"quota":         {"review.escalated", 1, 1},
		"auth":          {"review.escalated", 1, 1},
		"stubborn":      {"review.escalated", 3, 1},
	}
	for id, w := range want {
		e := e
		if envs[id] != nil {
			e = envs[id]
		}
		all := e.waitEnd(id)
		st := e.state(id)
		subject := id + ".go"
		mu.Lock()
		n := calls[subject]
		mu.Unlock()
		if last(all).Stage != w.end || st.Attempts != w.attempts || n != w.calls {
			t.Errorf("%s: ended %s after %d attempts and %d model calls; want %s, %d, %d (%s)",
				id, last(all).Stage, st.Attempts, n, w.end, w.attempts, w.calls, st.Reason)
		}
	}
	// No request body that failed deterministically was ever sent twice.
	seen := map[string]bool{}
	for _, r := range e.model.Requests() {
		body := string(r.Body)
		if seen[body] && !strings.Contains(body, "transient.go") && !strings.Contains(body, "retry-after.go") {
			t.Errorf("identical request sent again:\n%s", body)
		}
		seen[body] = true
	}
	if st := e.state("stubborn"); st.Refused != 2 || st.History[1].Reason == "" || !strings.Contains(st.History[1].Reason, "refused") {
		t.Errorf("stubborn: refused %d, second attempt %+v", st.Refused, st.History[1])
	}
	// The second deterministic attempt carried the error and the pre-commit.
	for _, r := range e.model.Requests() {
		if u := r.Messages[1].Content; strings.Contains(u, "deterministic.go") && strings.Contains(u, "attempt 2") {
			if !strings.Contains(u, "missing required field") || !strings.Contains(u, "<pre_commit>") {
				t.Errorf("second deterministic prompt:\n%s", u)
			}
		}
	}
	if st := envs["quota"].state("quota"); st.Status != events.StatusBlocked || !strings.Contains(st.Reason, "quota") {
		t.Errorf("quota: %s %q", st.Status, st.Reason)
	}
	// A later task on a key refused or out of quota is not sent: it goes
	// to a human with the fix the first call found.
	for _, id := range []string{"quota", "auth"} {
		envs[id].submit(events.Submit{ID: id + "-again", Type: "bug_fix", Subject: id + ".go"})
		if got := last(envs[id].waitEnd(id + "-again")).Stage; got != "review.escalated" {
			t.Errorf("%s-again ended with %s, want review.escalated", id, got)
		}
		mu.Lock()
		n := calls[id+".go"]
		mu.Unlock()
		if st := envs[id].state(id + "-again"); n != 1 || !strings.Contains(st.Reason, "not called again with this key") {
			t.Errorf("%s-again: %d calls of %s.go in all, reason %q; want 1, the key's mark", id, n, id, st.Reason)
		}
	}
}

// A task over its budget goes to a human; a type over its daily budget is
// blocked at the gate with reason budget.
func TestBudgets(t *testing.T) {
	pol := &policy.File{Types: map[string]policy.Type{
		"pricey": {Budget: &policy.Budget{Tokens: 200}},
		"daily":  {DailyBudget: &policy.Budget{Tokens: 250}},
	}}
	e := newEnv(t, func(_ int, r openaitest.Request) openaitest.Reply {
		if strings.Contains(r.Messages[1].Content, "pricey") {
			return openaitest.Reply{Content: openaitest.Failure("x", "no"), TokensIn: 100, TokensOut: 50}
		}
		return openaitest.Reply{Content: openaitest.Success("ok"), TokensIn: 100, TokensOut: 50}
	}, pol)
	e.start()
	e.submit(events.Submit{ID: "pricey-1", Type: "pricey", Subject: "pricey.go"})
	if got := last(e.waitEnd("pricey-1")).Stage; got != "review.escalated" {
		t.Fatalf("over-budget task ended with %s", got)
	}
	if st := e.state("pricey-1"); st.Attempts != 2 || !strings.Contains(st.Reason, "budget") {
		t.Fatalf("over-budget task: %d attempts, %q", st.Attempts, st.Reason)
	}
	for _, id := range []string{"d1", "d2", "d3"} {
		e.submit(events.Submit{ID: id, Type: "daily", Subject: id})
		e.waitEnd(id)
	}
	if st := e.state("d3"); st.Status != events.StatusNeedsHumanReview || !strings.Contains(st.Reason, "budget") {
		t.Fatalf("third task of a type over its daily budget: %s %q", st.Status, st.Reason)
	}
	if e.state("d2").Status != events.StatusSucceeded {
		t.Fatal("the second task ran over nothing")
	}
}
