package task

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// An error quoted in a stored reason is on one line and cut at 300 bytes
// on a rune boundary: never half a character in the task's state.
func TestOneLine(t *testing.T) {
	tests := []struct {
		name, s, want string
	}{
		{"short", "exit status 1", "exit status 1"},
		{"white space", "  panic:\n\tnil map  ", "panic: nil map"},
		{"cut", strings.Repeat("a", 301), strings.Repeat("a", 300) + "…"},
		// "é" is 2 bytes, from byte 1 on: byte 300 is inside the 150th, left out.
		{"rune boundary", "x" + strings.Repeat("é", 200), "x" + strings.Repeat("é", 149) + "…"},
		{"three-byte runes", strings.Repeat("日", 101), strings.Repeat("日", 100) + "…"},
		{"split at 300", strings.Repeat("a", 299) + "日本", strings.Repeat("a", 299) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := oneLine(tt.s)
			if got != tt.want {
				t.Fatalf("oneLine = %q, want %q", got, tt.want)
			}
			if !utf8.ValidString(got) {
				t.Fatalf("oneLine = %q: not valid UTF-8", got)
			}
		})
	}
}
