package executor

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	openai "github.com/sashabaranov/go-openai"
)

// DefaultTimeout bounds one OpenAI call when OpenAIConfig.Timeout is zero.
const DefaultTimeout = 2 * time.Minute

// OpenAIConfig configures an OpenAI-compatible chat-completions endpoint.
type OpenAIConfig struct {
	// BaseURL is the API root, requests go to BaseURL + "/chat/completions".
	// Default: https://api.openai.com/v1.
	BaseURL string
	// APIKey is sent as a bearer token. Default: none (Ollama, local vLLM).
	APIKey string
	// HTTPClient sends the requests. Default: a client of its own whose
	// transport keeps up to IdleConns connections to the endpoint for the
	// next calls (Go's default transport keeps 2: after a burst of calls
	// every other connection is closed and the next burst dials, and
	// handshakes TLS, again).
	HTTPClient *http.Client
	// IdleConns is how many idle connections the default client keeps for
	// reuse; set it to the executor's concurrency or more. Default
	// DefaultIdleConns. Ignored with HTTPClient.
	IdleConns int
	// Timeout bounds one call, answer included. Default DefaultTimeout (2m).
	Timeout time.Duration
}

// DefaultIdleConns is how many idle connections to the endpoint the
// default HTTP client keeps (OpenAIConfig.IdleConns).
const DefaultIdleConns = 1024

// transport is Go's default transport keeping up to idle connections per
// host instead of 2. Idle ones close after 90s, as with the default.
func transport(idle int) *http.Transport {
	if idle <= 0 {
		idle = DefaultIdleConns
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = idle, idle
	return t
}

// OpenAI is a Model backed by an OpenAI-compatible chat-completions endpoint.
// It sends the request's response format and tools, and leaves the
// temperature at the provider's default. It never retries: a failed call
// returns a *ProviderError. Identical Requests are sent as identical bytes.
type OpenAI struct {
	client   *openai.Client
	timeout  time.Duration
	endpoint string
}

// NewOpenAI returns a model calling the endpoint in cfg.
func NewOpenAI(cfg OpenAIConfig) *OpenAI {
	oc := openai.DefaultConfig(cfg.APIKey)
	if cfg.BaseURL != "" {
		oc.BaseURL = cfg.BaseURL
	}
	var doer openai.HTTPDoer = &http.Client{Transport: transport(cfg.IdleConns)}
	if cfg.HTTPClient != nil {
		doer = cfg.HTTPClient
	}
	oc.HTTPClient = recordingDoer{next: doer}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &OpenAI{client: openai.NewClientWithConfig(oc), timeout: cfg.Timeout, endpoint: oc.BaseURL}
}

// Endpoint is the API root the model calls; the executor's circuit breaker
// keys on it.
func (o *OpenAI) Endpoint() string { return o.endpoint }

// Complete sends req as one chat completion.
func (o *OpenAI) Complete(ctx context.Context, req Request) (Response, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	ans := &httpAnswer{}
	resp, err := o.client.CreateChatCompletion(context.WithValue(ctx, httpAnswerKey{}, ans), chatRequest(req))
	if err == nil && len(resp.Choices) == 0 {
		err = errors.New("the answer has no choices")
	}
	if err != nil {
		return Response{}, &ProviderError{Model: req.Model, StatusCode: ans.status, Header: ans.header, Err: err}
	}
	msg := resp.Choices[0].Message
	out := Response{
		Content:   msg.Content,
		Model:     resp.Model,
		TokensIn:  resp.Usage.PromptTokens,
		TokensOut: resp.Usage.CompletionTokens,
	}
	for _, tc := range msg.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return out, nil
}

// emptySchema is the parameters schema of a tool that declares none.
var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// chatRequest is req in the client's terms.
func chatRequest(req Request) openai.ChatCompletionRequest {
	cr := openai.ChatCompletionRequest{Model: req.Model, Messages: make([]openai.ChatCompletionMessage, len(req.Messages))}
	for i, m := range req.Messages {
		cm := openai.ChatCompletionMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			cm.ToolCalls = append(cm.ToolCalls, openai.ToolCall{
				ID: tc.ID, Type: openai.ToolTypeFunction,
				Function: openai.FunctionCall{Name: tc.Name, Arguments: tc.Arguments},
			})
		}
		cr.Messages[i] = cm
	}
	if req.ResponseFormat != "" {
		cr.ResponseFormat = &openai.ChatCompletionResponseFormat{Type: openai.ChatCompletionResponseFormatType(req.ResponseFormat)}
	}
	for _, t := range req.Tools {
		params := t.Parameters
		if len(params) == 0 {
			params = emptySchema
		}
		cr.Tools = append(cr.Tools, openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
			Name: t.Name, Description: t.Description, Parameters: params,
		}})
	}
	if req.ToolChoice != "" && len(cr.Tools) > 0 {
		cr.ToolChoice = req.ToolChoice
	}
	return cr
}

// httpAnswer keeps the status and headers of a call's HTTP answer, which the
// client's errors do not carry (Retry-After).
type httpAnswer struct {
	status int
	header http.Header
}

type httpAnswerKey struct{}

// recordingDoer fills the request context's *httpAnswer from the response.
type recordingDoer struct{ next openai.HTTPDoer }

func (d recordingDoer) Do(req *http.Request) (*http.Response, error) {
	resp, err := d.next.Do(req)
	if ans, ok := req.Context().Value(httpAnswerKey{}).(*httpAnswer); ok && resp != nil {
		ans.status, ans.header = resp.StatusCode, resp.Header.Clone()
	}
	return resp, err
}
