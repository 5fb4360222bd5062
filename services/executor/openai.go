package executor

import (
	"context"
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
	// HTTPClient sends the requests. Default: a new http.Client.
	HTTPClient *http.Client
	// Timeout bounds one call, answer included. Default DefaultTimeout (2m).
	Timeout time.Duration
}

// OpenAI is a Model backed by an OpenAI-compatible chat-completions endpoint.
// It asks for a JSON object answer (response_format json_object) and leaves
// the temperature at the provider's default. It never retries: a failed call
// returns a *ProviderError.
type OpenAI struct {
	client  *openai.Client
	timeout time.Duration
}

// NewOpenAI returns a model calling the endpoint in cfg.
func NewOpenAI(cfg OpenAIConfig) *OpenAI {
	oc := openai.DefaultConfig(cfg.APIKey)
	if cfg.BaseURL != "" {
		oc.BaseURL = cfg.BaseURL
	}
	var doer openai.HTTPDoer = &http.Client{}
	if cfg.HTTPClient != nil {
		doer = cfg.HTTPClient
	}
	oc.HTTPClient = recordingDoer{next: doer}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &OpenAI{client: openai.NewClientWithConfig(oc), timeout: cfg.Timeout}
}

// Complete sends req as one chat completion.
func (o *OpenAI) Complete(ctx context.Context, req Request) (Response, error) {
	msgs := make([]openai.ChatCompletionMessage, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = openai.ChatCompletionMessage{Role: m.Role, Content: m.Content}
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	ans := &httpAnswer{}
	resp, err := o.client.CreateChatCompletion(context.WithValue(ctx, httpAnswerKey{}, ans), openai.ChatCompletionRequest{
		Model:          req.Model,
		Messages:       msgs,
		ResponseFormat: &openai.ChatCompletionResponseFormat{Type: openai.ChatCompletionResponseFormatTypeJSONObject},
	})
	if err == nil && len(resp.Choices) == 0 {
		err = errors.New("the answer has no choices")
	}
	if err != nil {
		return Response{}, &ProviderError{Model: req.Model, StatusCode: ans.status, Header: ans.header, Err: err}
	}
	return Response{
		Content:   resp.Choices[0].Message.Content,
		Model:     resp.Model,
		TokensIn:  resp.Usage.PromptTokens,
		TokensOut: resp.Usage.CompletionTokens,
	}, nil
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
