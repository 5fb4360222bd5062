// Package prompt is the prompt builder: it consumes events.Admitted (stage
// "admitted") and publishes events.Prompted (stage "prompted") carrying the
// chat messages the executor sends to the model.
//
// The user message is a Go text/template per task type: DefaultTemplate, or
// the type's policy template. Before rendering, the last outcomes for the
// task's (type, subject) are loaded from the outcome history and injected as a
// <previous_attempts> block, together with the error context carried from a
// failed attempt or step, a reviewer's note and the instructions of the
// escalation rung. Everything that came from a model, a tool, a command or a
// human is XML-escaped, so no injected text can close a section or open a new
// one; the payload JSON is kept verbatim (escaped only where it holds <, > or
// &, which keeps it the same JSON value).
//
// Rendering is pure (Render, Build) and table-tested without a server;
// Service.Handle adds the history lookup and the policy.
package prompt
