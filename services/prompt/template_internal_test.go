package prompt

import (
	"maps"
	"slices"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// The policy checks a template with stand-ins for the functions prompt
// templates get: the same names, or a policy would refuse (or let through)
// what the prompt builder parses otherwise.
func TestPolicyKnowsTheTemplateFuncs(t *testing.T) {
	if got, want := slices.Sorted(maps.Keys(policy.TemplateFuncs)), slices.Sorted(maps.Keys(funcs)); !slices.Equal(got, want) {
		t.Fatalf("policy.TemplateFuncs %v, the prompt builder's %v", got, want)
	}
	f := &policy.File{Types: map[string]policy.Type{"x": {Template: DefaultTemplate}}}
	if err := f.Validate(); err != nil {
		t.Fatalf("the default template fails the policy's check: %v", err)
	}
}
