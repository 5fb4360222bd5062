package timeline

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	tests := []struct {
		name, s string
		n       int
		want    string
	}{
		{"short", "ok", 10, "ok"},
		{"one line", "a\nb", 10, "a b"},
		{"cut", "abcdefgh", 5, "abcde…"},
		// "é" is 2 bytes: a cut at 5 would split the third.
		{"rune boundary", "ééééé", 5, "éé…"},
		{"three-byte runes", strings.Repeat("日本", 30), 100, strings.Repeat("日本", 16) + "日…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := clip(tt.s, tt.n)
			if got != tt.want || !utf8.ValidString(got) {
				t.Fatalf("clip(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
			}
		})
	}
}
