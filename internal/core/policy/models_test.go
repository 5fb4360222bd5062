package policy_test

import (
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

func TestModelChainParses(t *testing.T) {
	f, err := policy.Parse([]byte(`{
	  "defaults": {"models": [{"model": "gpt-4o"}, {"name": "backup", "model": "gpt-4o", "base_url": "https://backup.example/v1", "credential": "backup"}]},
	  "types": {"css_fix": {}, "own": {"model": "gpt-4o-mini"}, "chain": {"models": [{"model": "llama3", "base_url": "http://ollama:11434/v1"}]}}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	chain := f.For("css_fix").Chain()
	if len(chain) != 2 || chain[0].Name != "gpt-4o" || chain[1].Name != "backup" || chain[1].Credential != "backup" {
		t.Errorf("css_fix chain %+v, want the defaults' two models, named", chain)
	}
	if c := f.For("own").Chain(); c != nil {
		t.Errorf("a type naming its own model took the defaults' chain %+v", c)
	}
	if c := f.For("chain").Chain(); len(c) != 1 || c[0].Name != "llama3" || c[0].BaseURL != "http://ollama:11434/v1" {
		t.Errorf("chain %+v, want the type's own", c)
	}
	if got := policy.CredentialEnv("backup"); got != "DISPATCH_CREDENTIAL_BACKUP" {
		t.Errorf("CredentialEnv = %q", got)
	}
}

func TestModelChainProblems(t *testing.T) {
	tests := []struct {
		name, models, want string
	}{
		{"no model", `[{"name": "a"}]`, "models[0]: needs a model"},
		{"same name", `[{"model": "m"}, {"model": "m", "base_url": "https://b.example/v1"}]`, `name "m" is used by models[0] too`},
		{"bad url", `[{"model": "m", "base_url": "ftp://x"}]`, "must be an http:// or https:// URL"},
		{"key in url", `[{"model": "m", "base_url": "https://sk:secret@x.example/v1"}]`, "must not carry credentials"},
		{"key in query", `[{"model": "m", "base_url": "https://x.example/v1?api-key=secret"}]`, "must not carry a query or a fragment"},
		{"empty query", `[{"model": "m", "base_url": "https://x.example/v1?"}]`, "must not carry a query or a fragment"},
		{"fragment", `[{"model": "m", "base_url": "https://x.example/v1#secret"}]`, "must not carry a query or a fragment"},
		{"key as credential", `[{"model": "m", "credential": "sk-proj-abc.def"}]`, "never the key itself"},
		{"a key field", `[{"model": "m", "api_key": "sk-1"}]`, `unknown field "api_key"`},
		{"bad name", `[{"model": "m", "name": "a b"}]`, `name "a b" must be`},
		{"too many", `[{"model":"1"},{"model":"2"},{"model":"3"},{"model":"4"},{"model":"5"},{"model":"6"},{"model":"7"},{"model":"8"},{"model":"9"}]`, "at most 8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := policy.Parse([]byte(`{"types": {"css_fix": {"models": ` + tt.models + `}}}`))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse: %v, want an error saying %q", err, tt.want)
			}
		})
	}
}
