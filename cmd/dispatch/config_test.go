package main

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
)

func TestParseErrorClasses(t *testing.T) {
	m, err := parseErrorClasses(" 409=transient, 418=deterministic ,413=config")
	if err != nil || m[409] != "transient" || m[418] != "deterministic" || m[413] != "config" || len(m) != 3 {
		t.Fatalf("got %v, %v", m, err)
	}
	for _, bad := range []string{"409", "409=maybe", "x=transient", "42=auth"} {
		if _, err := parseErrorClasses(bad); err == nil || !strings.Contains(err.Error(), "DISPATCH_ERROR_CLASSES") {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}

func TestParsePrices(t *testing.T) {
	p, err := parsePrices("gpt-4o=2.5/10, local=0/0")
	if err != nil || p["gpt-4o"].In != 2.5 || p["gpt-4o"].Out != 10 || len(p) != 2 {
		t.Fatalf("got %v, %v", p, err)
	}
	for _, bad := range []string{"gpt-4o=2.5", "gpt-4o=-1/10", "gpt-4o=NaN/1", "gpt-4o=1/+Inf"} {
		if _, err := parsePrices(bad); err == nil || !strings.Contains(err.Error(), "DISPATCH_PRICES") {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}

// loadConfig refuses durations that would make no sense, with every
// problem named.
func TestConfigRefusesBadDurations(t *testing.T) {
	t.Setenv("DISPATCH_ACK_WAIT", "0s")
	t.Setenv("DISPATCH_GRACE", "-1s")
	_, err := loadConfig()
	for _, want := range []string{"DISPATCH_ACK_WAIT must be positive", "DISPATCH_GRACE must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestContextLengthBodyAddsToTheBuiltIn(t *testing.T) {
	if got := (Config{}).contextLengthBody(); got != nil {
		t.Errorf("unset: %q, want nil (the built-in markers)", got)
	}
	got := Config{ContextLengthBody: []string{"prompt is too long"}}.contextLengthBody()
	if !slices.Contains(got, "prompt is too long") || !slices.Contains(got, "context_length_exceeded") {
		t.Errorf("set: %q, want the built-in markers and the extra one", got)
	}
}

func TestStateKey(t *testing.T) {
	if k, err := (Config{}).stateKey(); k != nil || err != nil {
		t.Errorf("unset: %v, %v; want nothing", k, err)
	}
	good := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))
	if k, err := (Config{StateKey: good}).stateKey(); len(k) != 32 || err != nil {
		t.Errorf("32 bytes: %d bytes, %v", len(k), err)
	}
	for _, bad := range []string{"not base64!", base64.StdEncoding.EncodeToString([]byte("short"))} {
		if _, err := (Config{StateKey: bad}).stateKey(); err == nil || !strings.Contains(err.Error(), "DISPATCH_STATE_KEY") {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}
