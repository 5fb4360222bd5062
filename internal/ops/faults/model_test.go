package faults_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/ops/faults"
)

// runMark is the line the policy's template puts first in every prompt, so
// the model knows which task, pass and attempt it answers.
const runMark = `<run task="{{.Task.ID}}" pass="{{.Run.Pass}}" attempt="{{.Run.Attempt}}"/>` + "\n"

var runMarkRE = regexp.MustCompile(`<run task="([A-Za-z0-9_-]+)" pass="(\d+)" attempt="(\d+)"/>`)

// model is an OpenAI-compatible chat-completions endpoint that answers each
// task by its plan, after a random latency, and keeps a ledger of every
// request. Each executor instance calls it under its own path
// (/<instance>/v1), so the ledger knows who called.
type model struct {
	ln       net.Listener
	srv      *http.Server
	plans    func(task string) (faults.Plan, bool)
	min, max time.Duration

	mu    sync.Mutex
	calls []faults.Call

	// midCall, when set, is called (once) with the instance of the next
	// call that will get an answer, before it is answered; afterAnswer
	// (once) right after the next such answer was written.
	midCall, afterAnswer atomic.Pointer[func(instance string)]
}

func startModel(t *testing.T, plans func(string) (faults.Plan, bool), minLatency, maxLatency time.Duration) *model {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &model{ln: ln, plans: plans, min: minLatency, max: maxLatency}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /{instance}/v1/chat/completions", m.serve)
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = m.srv.Serve(ln) }()
	t.Cleanup(func() { m.srv.Close() })
	return m
}

// baseURL is the OpenAI base URL of one executor instance.
func (m *model) baseURL(instance string) string {
	return "http://" + m.ln.Addr().String() + "/" + instance + "/v1"
}

// ledger returns every call so far.
func (m *model) ledger() []faults.Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]faults.Call(nil), m.calls...)
}

// armMidCall and armAfterAnswer set the hooks; disarm clears both.
func (m *model) armMidCall(f func(string))     { m.midCall.Store(&f) }
func (m *model) armAfterAnswer(f func(string)) { m.afterAnswer.Store(&f) }
func (m *model) disarm()                       { m.midCall.Store(nil); m.afterAnswer.Store(nil) }

func (m *model) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	var req struct {
		Model    string `json:"model"`
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(body, &req)
	chars := 0
	call := faults.Call{Instance: r.PathValue("instance"), Start: time.Now()}
	for _, msg := range req.Messages {
		chars += len(msg.Content)
		if mk := runMarkRE.FindStringSubmatch(msg.Content); mk != nil && call.Task == "" {
			call.Task = mk[1]
			call.Pass, _ = strconv.Atoi(mk[2])
			call.Attempt, _ = strconv.Atoi(mk[3])
		}
	}
	plan, known := m.plans(call.Task)

	m.mu.Lock()
	before := 0
	for _, c := range m.calls {
		if c.Task == call.Task && c.Pass == call.Pass {
			before++
		}
	}
	call.Answer = plan.Answer(call.Attempt)
	if call.Attempt == 1 && before < plan.Transient {
		call.Answer = faults.AnswerTransient
	}
	status, content, errBody := answer(call, known)
	call.Status = status
	if status == http.StatusOK {
		call.TokensIn, call.TokensOut = (chars+3)/4, (len(content)+3)/4
	}
	i := len(m.calls)
	m.calls = append(m.calls, call)
	m.mu.Unlock()

	final := call.Answer != faults.AnswerTransient
	if f := m.midCall.Load(); final && f != nil && m.midCall.CompareAndSwap(f, nil) {
		(*f)(call.Instance)
	}
	select {
	case <-time.After(m.min + rand.N(m.max-m.min+1)):
	case <-r.Context().Done():
		return // the caller went away (killed): not answered
	}
	var out []byte
	if status == http.StatusOK {
		out, _ = json.Marshal(map[string]any{
			"id": fmt.Sprintf("chatcmpl-%d", i), "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
			"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
				"message": map[string]any{"role": "assistant", "content": content}}},
			"usage": map[string]any{"prompt_tokens": call.TokensIn, "completion_tokens": call.TokensOut,
				"total_tokens": call.TokensIn + call.TokensOut},
		})
	} else {
		out = []byte(errBody)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	if _, err := w.Write(out); err != nil {
		return
	}
	// The whole answer goes out now: the caller has it (whatever it does
	// next) when the after-answer hook fires.
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	m.mu.Lock()
	m.calls[i].Answered = true
	m.mu.Unlock()
	if f := m.afterAnswer.Load(); final && f != nil && m.afterAnswer.CompareAndSwap(f, nil) {
		(*f)(call.Instance)
	}
}

// answer is the status and body for a call: a structured result (content)
// for 200, an OpenAI error body otherwise.
func answer(c faults.Call, known bool) (status int, content, errBody string) {
	if !known {
		return http.StatusBadRequest, "", `{"error":{"message":"faults: the prompt names no submitted task","type":"invalid_request_error"}}`
	}
	approach := fmt.Sprintf("approach %d of %s", c.Pass, c.Task) // never a dead end twice
	switch c.Answer {
	case faults.AnswerSuccess:
		return http.StatusOK, fmt.Sprintf(`{"status":"success","approach":%q,"summary":"fixed on attempt %d","changes":["a change"]}`, approach, c.Attempt), ""
	case faults.AnswerFailure:
		return http.StatusOK, fmt.Sprintf(`{"status":"failure","approach":%q,"summary":"still broken after attempt %d","changes":[]}`, approach, c.Attempt), ""
	case faults.AnswerDeterministic:
		return http.StatusBadRequest, "", `{"error":{"message":"Invalid value for 'tool_choice': scripted deterministic failure","type":"invalid_request_error","code":"invalid_value"}}`
	case faults.AnswerAuth:
		return http.StatusUnauthorized, "", `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`
	}
	return http.StatusServiceUnavailable, "", `{"error":{"message":"The server is overloaded","type":"server_error"}}`
}
