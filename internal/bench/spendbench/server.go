package spendbench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Call is one request the scripted server received, as its ledger keeps it.
type Call struct {
	// At is when the request arrived, since the server started.
	At time.Duration `json:"at"`
	// Status is the HTTP status answered.
	Status int `json:"status"`
	// Kind is success, failure (both 200 and billed), transient (503, 429
	// rate limit), invalid (400), auth (401), quota (429
	// insufficient_quota) or unknown (no ticket found: 400).
	Kind string `json:"kind"`
	// TokensIn and TokensOut are what the call billed (0 for an error).
	TokensIn  int `json:"tokens_in"`
	TokensOut int `json:"tokens_out"`
	// Hash identifies the request body (model, messages and parameters,
	// with JSON keys in canonical order).
	Hash string `json:"hash"`
}

// Transient reports whether the answer told the client to try again later.
func (c Call) Transient() bool { return c.Kind == kindTransient }

// Billed reports whether the call was billed (a 200 answer).
func (c Call) Billed() bool { return c.Status == http.StatusOK }

// Deterministic reports whether the answer was an error that the identical
// request would only get again (400, 401, 429 insufficient_quota).
func (c Call) Deterministic() bool {
	switch c.Kind {
	case kindInvalid, kindAuth, kindQuota, kindUnknown:
		return true
	}
	return false
}

// Stop reports whether the answer said no request of this task can succeed
// with these credentials (401, quota exhausted).
func (c Call) Stop() bool { return c.Kind == kindAuth || c.Kind == kindQuota }

// Tokens is what the call billed.
func (c Call) Tokens() int { return c.TokensIn + c.TokensOut }

// Server is the scripted OpenAI-compatible chat-completions endpoint. It
// decides every answer from the request alone (the ticket's scenario and its
// earlier calls) and keeps the ledger every figure is computed from.
type Server struct {
	srv     *http.Server
	ln      net.Listener
	start   time.Time
	latency time.Duration

	mu         sync.Mutex
	calls      map[string][]Call // by ticket
	unassigned []Call            // requests without a ticket
}

// StartServer serves on 127.0.0.1 on a free port. latency delays every
// answer (a stand-in for the model's think time; 0 answers at once).
func StartServer(latency time.Duration) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, start: time.Now(), latency: latency, calls: map[string][]Call{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.serve)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// BaseURL is the OpenAI base URL to configure.
func (s *Server) BaseURL() string { return "http://" + s.ln.Addr().String() + "/v1" }

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

// Ledger returns a copy of every call, by ticket.
func (s *Server) Ledger() map[string][]Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]Call, len(s.calls))
	for k, v := range s.calls {
		out[k] = append([]Call(nil), v...)
	}
	return out
}

// Unassigned returns the calls whose request named no ticket.
func (s *Server) Unassigned() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.unassigned...)
}

// chatRequest is the part of a chat-completions request the server reads.
type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	arrived := time.Since(s.start)
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		return
	}
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeAnswer(w, apiError(kindUnknown, http.StatusBadRequest, "invalid_request_error", "", "malformed JSON: "+err.Error(), nil), "", "")
		return
	}
	contents := make([]string, 0, len(req.Messages))
	chars := 0
	for _, m := range req.Messages {
		c := messageText(m.Content)
		contents = append(contents, c)
		chars += utf8.RuneCountInString(c)
	}
	all := strings.Join(contents, "\n")
	scenario, ticket := identify(contents)

	s.mu.Lock()
	var ans answer
	if ticket == "" || scenario == "" {
		ans = apiError(kindUnknown, http.StatusBadRequest, "invalid_request_error", "", "spendbench: no scenario and ticket in the request", nil)
	} else {
		p := prior{}
		for _, c := range s.calls[ticket] {
			p.calls++
			if c.Billed() {
				p.billed++
			}
		}
		ans = decide(scenario, ticket, all, p)
	}
	call := Call{At: arrived, Status: ans.status, Kind: ans.kind, Hash: requestHash(body)}
	if ans.status == http.StatusOK {
		call.TokensIn, call.TokensOut = tokens(chars), tokens(utf8.RuneCountInString(ans.content))
	}
	if ticket == "" {
		s.unassigned = append(s.unassigned, call)
	} else {
		s.calls[ticket] = append(s.calls[ticket], call)
	}
	id := fmt.Sprintf("chatcmpl-%s-%d", ticket, len(s.calls[ticket]))
	s.mu.Unlock()

	if s.latency > 0 {
		select {
		case <-time.After(s.latency):
		case <-r.Context().Done():
			return // the call is billed all the same: the model did the work
		}
	}
	ans.tokensIn, ans.tokensOut = call.TokensIn, call.TokensOut
	writeAnswer(w, ans, id, req.Model)
}

// tokens bills characters like the real API, about 4 to a token.
func tokens(chars int) int { return (chars + 3) / 4 }

// messageText is a message's content: a string, or the text parts of an
// array of content parts.
func messageText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

var (
	ticketJSON   = regexp.MustCompile(`"ticket"\s*:\s*"([A-Za-z0-9_-]{1,128})"`)
	scenarioJSON = regexp.MustCompile(`"scenario"\s*:\s*"([a-z0-9_-]{1,64})"`)
	ticketMark   = regexp.MustCompile(`\bticket=([A-Za-z0-9_-]{1,128})`)
	scenarioMark = regexp.MustCompile(`\bscenario=([a-z0-9_-]{1,64})`)
)

// identify finds the task's scenario and ticket in the message contents:
// the first "scenario"/"ticket" JSON fields, in whatever escaping the
// prompt put them (XML entities, JSON string escapes), or failing that the
// scenario=/ticket= markers the payload's text also carries.
func identify(contents []string) (scenario, ticket string) {
	for _, c := range contents {
		u := unescape(c)
		if scenario == "" {
			scenario = first(u, scenarioJSON, scenarioMark)
		}
		if ticket == "" {
			ticket = first(u, ticketJSON, ticketMark)
		}
		if scenario != "" && ticket != "" {
			return scenario, ticket
		}
	}
	return scenario, ticket
}

func first(s string, res ...*regexp.Regexp) string {
	for _, re := range res {
		if m := re.FindStringSubmatch(s); m != nil {
			return m[1]
		}
	}
	return ""
}

// unescape undoes XML/HTML entities (&#34;, &quot;, &amp;#34; twice
// escaped) and JSON string escapes of quotes.
func unescape(s string) string {
	for range 3 {
		u := html.UnescapeString(s)
		if u == s {
			break
		}
		s = u
	}
	return strings.ReplaceAll(s, `\"`, `"`)
}

// requestHash identifies a request body: the JSON re-encoded with its keys
// in order, so the same request hashes the same however it was encoded.
func requestHash(body []byte) string {
	var v any
	canonical := body
	if err := json.Unmarshal(body, &v); err == nil {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if enc.Encode(v) == nil {
			canonical = buf.Bytes()
		}
	}
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:8])
}

func writeAnswer(w http.ResponseWriter, a answer, id, model string) {
	for k, v := range a.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	if a.status != http.StatusOK {
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": model,
		"choices": []map[string]any{{
			"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": a.content},
		}},
		"usage": map[string]any{"prompt_tokens": a.tokensIn, "completion_tokens": a.tokensOut, "total_tokens": a.tokensIn + a.tokensOut},
	})
}
