package client

import (
	"strings"
	"testing"
)

// An answer that does not decode is quoted cut at 200 bytes, never in the
// middle of a character.
func TestClip(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"short", `{"x":`, `{"x":`},
		{"cut", strings.Repeat("a", 201), strings.Repeat("a", 200) + "…"},
		// "日" is 3 bytes: byte 200 is inside the 67th, left out.
		{"rune boundary", strings.Repeat("日", 70), strings.Repeat("日", 66) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := clip([]byte(tt.in)); got != tt.want {
				t.Fatalf("clip = %q, want %q", got, tt.want)
			}
		})
	}
}
