// Package openaitest is a real HTTP server speaking the OpenAI
// chat-completions API, scripted per call, that records every request it
// gets. Only tests import it.
package openaitest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// Request is one chat-completions request as received.
type Request struct {
	Body []byte
	// Header holds the request's headers (Authorization: the key).
	Header   http.Header
	Model    string
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
}

// Reply is what the server answers to one call.
type Reply struct {
	// Status is the HTTP status (default 200).
	Status int
	// Content is the assistant message of a 200 answer.
	Content string
	// Body replaces the whole response body (for error answers).
	Body string
	// Header is added to the response (e.g. Retry-After).
	Header http.Header
	// TokensIn/TokensOut are reported as usage (default 100/50).
	TokensIn, TokensOut int
}

// Script decides the reply to the n-th call (1-based).
type Script func(n int, req Request) Reply

// Server is the fake endpoint.
type Server struct {
	*httptest.Server
	mu       sync.Mutex
	script   Script
	requests []Request
	// Started, when set, receives each request as it arrives (before it is answered).
	Started chan Request
	// Block, when set, holds each answer until it is closed or the request is cancelled.
	Block chan struct{}
	// Cancelled, when set, receives each request whose context ended (the
	// client gave up on it) while Block held it.
	Cancelled chan Request
}

// New starts a server answering with script; closed at cleanup.
func New(t testing.TB, script Script) *Server {
	s := &Server{script: script}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// BaseURL is what to configure as the OpenAI base URL.
func (s *Server) BaseURL() string { return s.URL + "/v1" }

// Requests returns every request received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Calls counts the requests received so far.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

// Success is a structured result the executor parses as a success.
func Success(approach string) string {
	return fmt.Sprintf(`{"status":"success","approach":%q,"summary":"done","changes":["a change"]}`, approach)
}

// Failure is a structured result the executor parses as a failed attempt.
func Failure(approach, why string) string {
	return fmt.Sprintf(`{"status":"failure","approach":%q,"summary":%q,"changes":[]}`, approach, why)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error":{"message":"not found","type":"invalid_request_error"}}`, http.StatusNotFound)
		return
	}
	body, _ := io.ReadAll(r.Body)
	req := Request{Body: body, Header: r.Header.Clone()}
	_ = json.Unmarshal(body, &req)
	s.mu.Lock()
	s.requests = append(s.requests, req)
	n := len(s.requests)
	s.mu.Unlock()
	if s.Started != nil {
		s.Started <- req
	}
	if s.Block != nil {
		select {
		case <-s.Block:
		case <-r.Context().Done():
			if s.Cancelled != nil {
				s.Cancelled <- req
			}
			return
		}
	}
	rep := s.script(n, req)
	for k, v := range rep.Header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	if rep.Status == 0 {
		rep.Status = http.StatusOK
	}
	if rep.Body != "" || rep.Status != http.StatusOK {
		w.WriteHeader(rep.Status)
		_, _ = io.WriteString(w, rep.Body)
		return
	}
	if rep.TokensIn == 0 && rep.TokensOut == 0 {
		rep.TokensIn, rep.TokensOut = 100, 50
	}
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("chatcmpl-%d", n), "object": "chat.completion", "created": 1700000000, "model": req.Model,
		"choices": []map[string]any{{
			"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": rep.Content},
		}},
		"usage": map[string]any{"prompt_tokens": rep.TokensIn, "completion_tokens": rep.TokensOut, "total_tokens": rep.TokensIn + rep.TokensOut},
	})
}
