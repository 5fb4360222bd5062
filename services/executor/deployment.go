package executor

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

// deploymentError is the Result.Error of a model call that failed through
// the deployment's fault (auth, quota, config; see events.DeploymentFault):
// what to fix first — the reason a human reads — then everything the
// provider said.
func (r Rules) deploymentError(class events.ErrorClass, err error, endpoint string) string {
	if ce := (*CommandError)(nil); errors.As(err, &ce) {
		return r.fix(class, err, endpoint) + "; " + errorText(err)
	}
	return r.fix(class, err, endpoint) + "; the provider said: " + errorText(err)
}

// fix says what in the deployment to change after a failure of class.
func (r Rules) fix(class events.ErrorClass, err error, endpoint string) string {
	status, _, body, _ := errorDetails(err)
	model := ""
	if pe := (*ProviderError)(nil); errors.As(err, &pe) {
		model = pe.Model
	}
	if ce := (*CommandError)(nil); class == events.ErrorClassConfig && errors.As(err, &ce) {
		why := classifyCommand(ce).Reason
		if ce.ExitCode < 0 && ce.Err != nil {
			why = ce.Err.Error()
		}
		return fmt.Sprintf("deployment: the command %q cannot run (%s) — install it where the executor runs (on its PATH) or fix the command in the type's policy",
			textcut.ClipRunes(strings.Join(ce.Argv, " "), 120), why)
	}
	if status == 0 && class == events.ErrorClassConfig {
		if fix, ok := endpointFix(err, endpoint); ok {
			return fix
		}
	}
	switch {
	case class == events.ErrorClassAuth && status == 401:
		return fmt.Sprintf("deployment: the API key was refused (401) at %s — check DISPATCH_OPENAI_API_KEY", endpoint)
	case class == events.ErrorClassAuth && status == 403:
		return fmt.Sprintf("deployment: access to model %q was denied (403) at %s — check the API key's permissions (DISPATCH_OPENAI_API_KEY) or set another model for the type", model, endpoint)
	case class == events.ErrorClassAuth:
		return fmt.Sprintf("deployment: the credentials were refused (%s) at %s — check DISPATCH_OPENAI_API_KEY", statusText(status), endpoint)
	case class == events.ErrorClassQuota:
		return fmt.Sprintf("deployment: quota exhausted at %s — raise the quota or the billing limit", endpoint)
	case class == events.ErrorClassConfig && status == 404 && strings.Contains(strings.ToLower(body), "model"):
		return fmt.Sprintf("deployment: model %q not found at %s — set the type's model in the policy or DISPATCH_MODEL", model, endpoint)
	case class == events.ErrorClassConfig && status == 404:
		return fmt.Sprintf("deployment: %s has no chat-completions endpoint (404) — check DISPATCH_OPENAI_BASE_URL", endpoint)
	case class == events.ErrorClassConfig && status == 400 && r.contextExceeded(body):
		prompt, limit := contextTokens(body)
		return fmt.Sprintf("deployment: the prompt%s exceeds the context%s of model %q — choose a model with a larger context or shorten the type's prompt (its template, the history it includes)",
			inParens(prompt), inParens(limit), model)
	case class == events.ErrorClassConfig && (status == 400 || status == 422) && r.shapeRejected(body):
		return fmt.Sprintf("deployment: %s does not support the request's shape for model %q (%s) — choose a model that supports what the mesh sends (JSON answers; tools, when the type offers some) for the type or in DISPATCH_MODEL, or drop the type's tools",
			endpoint, model, statusText(status))
	}
	return fmt.Sprintf("deployment: %s answered %s for model %q, a configuration error (DISPATCH_ERROR_CLASSES) — fix what the provider names below", endpoint, statusText(status), model)
}

// endpointFix says what to change when the endpoint cannot be called at
// all (unusableEndpoint).
func endpointFix(err error, endpoint string) (string, bool) {
	c, ok := unusableEndpoint(err)
	switch {
	case !ok:
		return "", false
	case errors.Is(err, http.ErrSchemeMismatch):
		return fmt.Sprintf("deployment: %s answers HTTP, not HTTPS — use an http:// URL in DISPATCH_OPENAI_BASE_URL", endpoint), true
	}
	if u, bad := badURL(err); bad {
		return fmt.Sprintf("deployment: the endpoint URL %q cannot be called — set DISPATCH_OPENAI_BASE_URL to an http:// or https:// URL with a host", u), true
	}
	return fmt.Sprintf("deployment: %s at %s — check the host name in DISPATCH_OPENAI_BASE_URL, or add its CA to the executor's trust store (SSL_CERT_FILE)", c.Reason, endpoint), true
}

var (
	contextLimitRe  = regexp.MustCompile(`(?i)maximum context length is (\d+)`)
	contextPromptRe = regexp.MustCompile(`(?i)(?:resulted in|requested) (\d+) tokens`)
)

// contextTokens reads the prompt's token count and the model's limit from a
// context-length error's body (OpenAI, Azure and vLLM word it alike); 0
// when the body does not say.
func contextTokens(body string) (prompt, limit int) {
	read := func(re *regexp.Regexp) int {
		if m := re.FindStringSubmatch(body); m != nil {
			if n, err := strconv.Atoi(m[1]); err == nil {
				return n
			}
		}
		return 0
	}
	return read(contextPromptRe), read(contextLimitRe)
}

// inParens is " (N tokens)", or "" for 0.
func inParens(tokens int) string {
	if tokens <= 0 {
		return ""
	}
	return fmt.Sprintf(" (%d tokens)", tokens)
}
