package policy

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Model is one entry of a type's model chain (Type.Models): a model at an
// endpoint, called with a key. The chain is tried in order: a model
// cooling down (its calls failed transiently), or whose endpoint or key
// the deployment got wrong, passes the call to the next one.
//
// A key is never written in the policy (the policy bucket is readable by
// every service and kept for ever): Credential names it, and each executor
// reads its value from its own environment, DISPATCH_CREDENTIAL_<NAME>
// (CredentialEnv).
type Model struct {
	// Name labels the entry in events, metrics and logs; unique in the
	// chain. Default: Model.
	Name string `json:"name,omitempty"`
	// Model is the model name sent to the endpoint. Required.
	Model string `json:"model"`
	// BaseURL is the endpoint's API root (http or https; no user,
	// password, query or fragment). Default: the executor's
	// (DISPATCH_OPENAI_BASE_URL).
	BaseURL string `json:"base_url,omitempty"`
	// Credential names the API key: the executor reads
	// DISPATCH_CREDENTIAL_<CREDENTIAL> (upper-cased). Default: the
	// executor's key (DISPATCH_OPENAI_API_KEY).
	Credential string `json:"credential,omitempty"`
}

// Label is the entry's name: Name, else Model.
func (m Model) Label() string {
	if m.Name != "" {
		return m.Name
	}
	return m.Model
}

// CredentialPrefix starts the environment variable a named credential is
// read from.
const CredentialPrefix = "DISPATCH_CREDENTIAL_"

// CredentialEnv is the environment variable holding the named credential's
// key: DISPATCH_CREDENTIAL_ and the name upper-cased.
func CredentialEnv(name string) string { return CredentialPrefix + strings.ToUpper(name) }

// credentialName is what a credential may be called: it becomes part of an
// environment variable's name.
var credentialName = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// modelLabel is what a chain entry's name may be: it becomes a metric
// label and is written in events.
var modelLabel = regexp.MustCompile(`^[A-Za-z0-9_.:/@-]{1,128}$`)

// MaxModels bounds a type's chain.
const MaxModels = 8

// Chain is the type's model chain, each entry's Name filled (Label); nil
// when the type has none (its model is Model, or the default).
func (t Type) Chain() []Model {
	if len(t.Models) == 0 {
		return nil
	}
	out := make([]Model, len(t.Models))
	for i, m := range t.Models {
		m.Name = m.Label()
		out[i] = m
	}
	return out
}

// modelProblems are those of an entry's model chain.
func modelProblems(where string, models []Model) []error {
	var errs []error
	if len(models) > MaxModels {
		errs = append(errs, fmt.Errorf("%s: models lists %d models, at most %d", where, len(models), MaxModels))
	}
	seen := map[string]int{}
	for i, m := range models {
		at := fmt.Sprintf("%s: models[%d]", where, i)
		if strings.TrimSpace(m.Model) == "" {
			errs = append(errs, fmt.Errorf("%s: needs a model", at))
			continue
		}
		label := m.Label()
		switch {
		case !modelLabel.MatchString(label):
			errs = append(errs, fmt.Errorf("%s: name %q must be 1-128 characters of A-Z, a-z, 0-9 and _ . : / @ - (set name when the model's is not)", at, label))
		case seen[label] > 0:
			errs = append(errs, fmt.Errorf("%s: name %q is used by models[%d] too (set name to tell them apart)", at, label, seen[label]-1))
		}
		seen[label] = i + 1
		if m.BaseURL != "" {
			if u, err := url.Parse(m.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				errs = append(errs, fmt.Errorf("%s: base_url %q must be an http:// or https:// URL with a host", at, m.BaseURL))
			} else if u.User != nil {
				errs = append(errs, fmt.Errorf("%s: base_url must not carry credentials: name them in credential (%s<NAME> in the executor's environment)", at, CredentialPrefix))
			} else if strings.ContainsAny(m.BaseURL, "?#") {
				// a key in it (?api-key=) would be in the bucket, the logs,
				// the events and a metric label
				errs = append(errs, fmt.Errorf("%s: base_url must not carry a query or a fragment: the API root only, the key named in credential (%s<NAME> in the executor's environment)", at, CredentialPrefix))
			}
		}
		if m.Credential != "" && !credentialName.MatchString(m.Credential) {
			errs = append(errs, fmt.Errorf("%s: credential %q must be 1-64 characters of A-Z, a-z, 0-9 and _: it names the environment variable %s<NAME>, never the key itself", at, m.Credential, CredentialPrefix))
		}
	}
	return errs
}
