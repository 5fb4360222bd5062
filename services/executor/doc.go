// Package executor is the stage that runs an attempt: it consumes
// events.Prompted (stage "prompted"), sends the prompt to a Model — or runs
// the type's agent command, or a pipeline's command step — and publishes one
// events.Executed (stage "executed") for the recorder.
//
// Two models ship with it: OpenAI, any OpenAI-compatible chat-completions
// endpoint (OpenAI, Azure, Ollama, vLLM, LiteLLM…), and Simulated, the
// built-in stand-in used when no API key is configured. A type whose policy
// says executor "command" runs its agent CLI instead, with the prompt as
// text on stdin (PromptText). The answer is the structured result (see
// ParseResult):
//
//	{"status":"success"|"failure","approach":"...","summary":"...","changes":["..."]}
//
// Its free text is capped, each cut marked "… [cut: N bytes more]":
// approach 2 KiB, summary 8 KiB, 32 changes of 512 bytes, error 8 KiB
// (events.MaxApproach …). An answer of any size is paid for once: its
// Executed is always small enough to store (MaxExecuted), never
// redelivered to call the model again.
//
// # Error discipline
//
// Every failed call is classified (Classify) and never retried blindly:
//
//   - transient (5xx, timeouts, resets, rate limits, exit 75 of an agent
//     command): the identical request is sent again later. Handle returns a
//     services.SnoozeError — Retry-After when given, else exponential backoff
//     with full jitter over the attempt's transient count, kept in
//     TaskState.TransientRetries — and publishes nothing: it is not an
//     attempt. Past the type's transient budget the attempt fails with
//     "provider unavailable". A circuit breaker per model stops calling a
//     model that keeps failing and lets one probe through after a cool-down;
//     with Config.ModelStates (bucket dispatch_models) every instance shares
//     it.
//   - deterministic (400, 422 …), auth (401, 403), quota (a 429 saying so)
//     and config (a 404: no such model or endpoint; a 400 saying the prompt
//     exceeds the context): the attempt fails with everything the provider
//     said, and the request's hash (RequestHash) is added to
//     TaskState.FailedRequests. A later request with the same hash is
//     refused without being sent (ErrorClassRefused): the request must
//     change. Auth, quota and config are the deployment's fault
//     (events.DeploymentFault): their error leads with what to fix
//     ("deployment: the API key was refused (401) at … — check
//     DISPATCH_OPENAI_API_KEY"), they go to a human and never lower trust.
//
// # Model chains
//
// A type's policy may list models in order (policy.Model: a model, its
// endpoint, the name of its key, read from DISPATCH_CREDENTIAL_<NAME>).
// Each call goes to the first that takes it: a model cooling down, marked
// dead, without its key, or to which the request already failed is passed
// over; one that fails transiently or by the deployment's fault (401, 403,
// a spent quota, a 404 model) hands the call to the next at once — not an
// attempt, no snooze. The deployment's faults are marked in the bucket for
// every instance (CircuitConfig.DeadFor). Only when no model is left does
// the attempt go to a human (NoModelLeft names each model's fix). The
// Result names the answering entry (Route) and those passed over
// (Fallbacks).
//
// # Tools
//
// A type's policy tools (and, on the RESEARCH rung, its research tools) are
// offered to the model by function calling and run over NATS request-reply.
// A tool's error reply (micro error headers) is classified like an HTTP
// status and given to the model in full; a call identical to one that
// failed deterministically (ToolCallHash) is refused before it is sent.
//
// A tool loop cut short — by a transient failure of the model or of a
// tool, or by shutdown — is kept in the task state (TaskState.Resume, its
// spend in TaskState.Unbilled) and the redelivery resumes where it
// stopped: the model's paid turns are never sent again just to ask the
// tool again. A tool that does not answer (no responders, a timeout, its
// 5xx) makes the task wait: snoozed with half-jitter backoff
// (Config.ToolBackoff), no model call, not an attempt, not counted against
// the transient budget, until the tool answers; past the type's tool_wait
// (DefaultToolWait, from the first time it did not answer) the attempt
// fails with ErrorClassToolUnavailable, naming the tool and its subject,
// for a human.
//
// Tokens and cost are summed over every call of the attempt. A cancelled
// context (shutdown) is not an attempt either: Handle returns ctx.Err() so
// the message is redelivered. An attempt a human's cancel cuts short is
// dropped, but what its calls had spent stays in TaskState.Unbilled
// (task.Abandon).
package executor
