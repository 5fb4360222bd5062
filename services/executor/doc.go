// Package executor is the stage that calls the model: it consumes
// events.Prompted (stage "prompted"), sends the prompt's messages to a Model
// and publishes one events.Executed (stage "executed") for the recorder.
//
// Two models ship with it: OpenAI, any OpenAI-compatible chat-completions
// endpoint (OpenAI, Azure, Ollama, vLLM, LiteLLM…), and Simulated, the
// built-in stand-in used when no API key is configured.
//
// The model is asked for a structured answer (see ParseResult):
//
//	{"status":"success"|"failure","approach":"...","summary":"...","changes":["..."]}
//
// Every call becomes exactly one Result: a success, a failure the model
// reported (ErrorClassTask), an answer that could not be parsed
// (ErrorClassInvalidOutput) or a call that failed (ErrorClassModel). Tokens and
// cost are recorded on every call that returned an answer. A cancelled context
// (shutdown) is not an attempt: Handle returns ctx.Err() so the message is
// redelivered.
package executor
