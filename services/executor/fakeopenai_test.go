package executor_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// reply is one scripted answer of the fake OpenAI endpoint.
type reply struct {
	status int
	body   string
	header http.Header
	// block holds the request until the client gives up on it.
	block bool
}

// answer is a 200 chat completion whose message content is content.
func answer(content string, tokensIn, tokensOut int) reply {
	body, _ := json.Marshal(map[string]any{
		"id": "chatcmpl-test", "object": "chat.completion", "created": 1,
		"model": "{{model}}",
		"choices": []map[string]any{{
			"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": content},
		}},
		"usage": map[string]any{"prompt_tokens": tokensIn, "completion_tokens": tokensOut, "total_tokens": tokensIn + tokensOut},
	})
	return reply{status: http.StatusOK, body: string(body)}
}

// apiError is an OpenAI-style error answer.
func apiError(status int, message string) reply {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": message, "type": "invalid_request_error"}})
	return reply{status: status, body: string(body)}
}

// sentRequest is what the fake saw of one chat-completions request.
type sentRequest struct {
	Model          string           `json:"model"`
	Messages       []events.Message `json:"messages"`
	ResponseFormat *struct {
		Type string `json:"type"`
	} `json:"response_format"`
	Raw map[string]json.RawMessage `json:"-"`
}

// fakeOpenAI is a real HTTP server speaking POST /v1/chat/completions,
// answering each call with the next scripted reply and recording the bodies.
type fakeOpenAI struct {
	*httptest.Server
	// received gets a value when a blocking reply's request arrives.
	received chan struct{}

	mu       sync.Mutex
	replies  []reply
	requests []sentRequest
}

func newFakeOpenAI(t *testing.T, replies ...reply) *fakeOpenAI {
	t.Helper()
	f := &fakeOpenAI{replies: replies, received: make(chan struct{}, 1)}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

// URL of the API root, the BaseURL a client needs.
func (f *fakeOpenAI) BaseURL() string { return f.URL + "/v1" }

func (f *fakeOpenAI) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, fmt.Sprintf("unexpected %s %s", r.Method, r.URL.Path), http.StatusNotFound)
		return
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req sentRequest
	if err := json.Unmarshal(data, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	_ = json.Unmarshal(data, &req.Raw)
	f.mu.Lock()
	f.requests = append(f.requests, req)
	next := apiError(http.StatusInternalServerError, "fake: no reply scripted for this call")
	if len(f.replies) > 0 {
		next, f.replies = f.replies[0], f.replies[1:]
	}
	f.mu.Unlock()

	if next.block {
		f.received <- struct{}{}
		<-r.Context().Done()
		return
	}
	for k, vs := range next.header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(next.status)
	body := next.body
	if next.status == http.StatusOK {
		model, _ := json.Marshal(req.Model)
		body = strings.Replace(body, `"{{model}}"`, string(model), 1)
	}
	_, _ = io.WriteString(w, body)
}

// Requests returns the request bodies received so far.
func (f *fakeOpenAI) Requests() []sentRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentRequest(nil), f.requests...)
}
