package rebuild

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// A Difference shows a value's first 200 bytes, cut on a rune boundary.
func TestClip(t *testing.T) {
	tests := []struct {
		name string
		raw  json.RawMessage
		want string
	}{
		{"none", nil, "(none)"},
		{"short", json.RawMessage(`"ok"`), `"ok"`},
		{"cut", json.RawMessage(strings.Repeat("a", 201)), strings.Repeat("a", 200) + "…"},
		// `"` then 2-byte "é"s: byte 200 is inside the 100th, left out.
		{"rune boundary", json.RawMessage(`"` + strings.Repeat("é", 150) + `"`), `"` + strings.Repeat("é", 99) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := clip(tt.raw)
			if got != tt.want || !utf8.ValidString(got) {
				t.Fatalf("clip = %q, want %q", got, tt.want)
			}
		})
	}
}
