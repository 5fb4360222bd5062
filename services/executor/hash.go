package executor

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"
)

// ToolHashPrefix marks a failed tool call's hash in TaskState.FailedRequests.
const ToolHashPrefix = "tool:"

// RequestHash identifies a request by what the model sees: the model name
// (and the endpoint and key of a chain's model that has its own),
// the normalised messages (role and content, line endings as \n, trailing
// whitespace of every line and of the whole trimmed; tool calls by name and
// normalised arguments, without the provider's call ids) and the parameters
// (response format, tools offered, tool choice). It is the hex SHA-256 of a
// canonical JSON encoding. Two requests with the same hash get the same answer
// from a deterministic failure, so the executor never sends one again after
// it failed deterministically.
func RequestHash(req Request) string {
	type call struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	type message struct {
		Role      string `json:"role"`
		Content   string `json:"content"`
		ToolCalls []call `json:"tool_calls,omitempty"`
		Answers   bool   `json:"answers_tool_call,omitempty"`
	}
	type tool struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	}
	canon := struct {
		Model          string    `json:"model"`
		Endpoint       string    `json:"endpoint,omitempty"`
		Messages       []message `json:"messages"`
		ResponseFormat string    `json:"response_format,omitempty"`
		Tools          []tool    `json:"tools,omitempty"`
		ToolChoice     string    `json:"tool_choice,omitempty"`
	}{Model: req.Model, Endpoint: req.Endpoint, ResponseFormat: req.ResponseFormat, ToolChoice: req.ToolChoice}
	for _, m := range req.Messages {
		cm := message{Role: m.Role, Content: normaliseText(m.Content), Answers: m.ToolCallID != ""}
		for _, tc := range m.ToolCalls {
			cm.ToolCalls = append(cm.ToolCalls, call{Name: tc.Name, Arguments: canonicalJSON(tc.Arguments)})
		}
		canon.Messages = append(canon.Messages, cm)
	}
	for _, t := range req.Tools {
		canon.Tools = append(canon.Tools, tool{Name: t.Name, Description: normaliseText(t.Description), Parameters: canonicalJSON(string(t.Parameters))})
	}
	data, err := json.Marshal(canon)
	if err != nil { // cannot happen: canonicalJSON only returns valid JSON
		panic(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// ToolCallHash identifies a tool call by the tool's name and its normalised
// arguments (JSON re-encoded with sorted keys and no insignificant space;
// arguments that are not JSON are taken as trimmed text). It carries
// ToolHashPrefix, as stored in TaskState.FailedRequests.
func ToolCallHash(name, arguments string) string {
	sum := sha256.Sum256([]byte(name + "\x00" + string(canonicalJSON(arguments))))
	return ToolHashPrefix + hex.EncodeToString(sum[:])
}

// HashPrefix is the short form of a hash that messages quote.
func HashPrefix(hash string) string {
	hash = strings.TrimPrefix(hash, ToolHashPrefix)
	return hash[:min(len(hash), 12)]
}

// normaliseText turns \r\n into \n and trims the trailing whitespace of every
// line and of the whole text.
func normaliseText(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t\r\v\f")
	}
	return strings.TrimRight(strings.Join(lines, "\n"), " \t\r\n\v\f")
}

// canonicalJSON re-encodes a JSON text with sorted object keys and exact
// numbers; text that is not one JSON value is encoded as a JSON string of
// its trimmed self. "" is null.
func canonicalJSON(s string) json.RawMessage {
	s = strings.TrimSpace(s)
	if s == "" {
		return json.RawMessage("null")
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err == nil {
		if _, err := dec.Token(); err == io.EOF { // nothing after the value
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			if enc.Encode(v) == nil {
				return json.RawMessage(bytes.TrimSpace(buf.Bytes()))
			}
		}
	}
	b, _ := json.Marshal(s)
	return b
}
