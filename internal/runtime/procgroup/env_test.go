package procgroup

import (
	"slices"
	"testing"
)

func TestEnviron(t *testing.T) {
	t.Setenv("PATH", "/usr/bin")
	t.Setenv("LC_TIME", "C")
	t.Setenv("DISPATCH_OPENAI_API_KEY", "sk-secret")
	t.Setenv("NATS_PASSWORD_GATE", "secret")
	t.Setenv("VENDOR_KEY", "v")
	t.Setenv("VENDOR_KEYRING", "r")
	env := Environ([]string{"VENDOR_KEY"})
	for _, want := range []string{"PATH=/usr/bin", "LC_TIME=C", "VENDOR_KEY=v"} {
		if !slices.Contains(env, want) {
			t.Errorf("Environ lacks %s: %v", want, env)
		}
	}
	for _, kv := range env {
		switch kv {
		case "DISPATCH_OPENAI_API_KEY=sk-secret", "NATS_PASSWORD_GATE=secret", "VENDOR_KEYRING=r":
			t.Errorf("Environ passes %s on", kv)
		}
	}
	if env := Environ(nil); env == nil {
		t.Error("Environ(nil) is nil: exec would pass the whole environment on")
	}
}
