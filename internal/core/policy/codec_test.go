package policy_test

import (
	"bytes"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	f, err := policy.Parse([]byte(spec7))
	if err != nil {
		t.Fatal(err)
	}
	data, err := policy.Encode(f)
	if err != nil {
		t.Fatal(err)
	}
	g, err := policy.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	again, err := policy.Encode(g)
	if err != nil || !bytes.Equal(data, again) {
		t.Fatalf("round trip differs (%v):\n%s\n%s", err, data, again)
	}
}

// FuzzDecode: the bucket holds whatever anyone with write access put there.
// Decode never panics, and what it accepts validates, names no template
// file and survives Encode unchanged in meaning.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(spec7))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"types": {"a": {"template_file": "x"}}}`))
	f.Add([]byte(`{"defaults": {"template": "{{.Task.ID}}", "tools": [{"name": "t", "subject": "tool.t", "parameters": {}}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := policy.Decode(data)
		if err != nil {
			return
		}
		if p.Validate() != nil {
			t.Fatal("Decode accepted what Validate rejects")
		}
		enc, err := policy.Encode(p)
		if err != nil {
			t.Fatalf("Encode of a decoded policy: %v", err)
		}
		q, err := policy.Decode(enc)
		if err != nil {
			t.Fatalf("Decode of an encoded policy: %v", err)
		}
		for name := range p.Types {
			_ = q.For(name)
		}
	})
}
