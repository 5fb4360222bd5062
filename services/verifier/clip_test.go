package verifier

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	long := strings.Repeat("a", MaxDetail+10)
	multi := strings.Repeat("é", MaxDetail) // 2 bytes each
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"trimmed", "  ok\n", "ok"},
		{"exactly max", long[:MaxDetail], long[:MaxDetail]},
		{"cut", long, long[:MaxDetail-len("…")] + "…"},
		{"rune boundary", multi, multi[:MaxDetail-4] + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := clip(tt.in)
			if got != tt.want {
				t.Errorf("clip = %.30q… (%d bytes), want %.30q… (%d bytes)", got, len(got), tt.want, len(tt.want))
			}
			if len(got) > MaxDetail || !utf8.ValidString(got) {
				t.Errorf("clip gave %d bytes, valid %v", len(got), utf8.ValidString(got))
			}
		})
	}
}
