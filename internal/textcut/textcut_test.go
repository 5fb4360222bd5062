package textcut_test

import (
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dispatchmesh/dispatchmesh/internal/textcut"
)

func TestCut(t *testing.T) {
	long := strings.Repeat("a", 12_400)
	tests := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"fits", "short", 5, "short"},
		{"empty", "", 0, ""},
		// The mark is 28 bytes ("…" is 3): 72 are kept.
		{"marked", long, 100, strings.Repeat("a", 72) + "… [cut: 12,328 bytes more]"},
		{"thousands", strings.Repeat("b", 1_234_607), 40, strings.Repeat("b", 9) + "… [cut: 1,234,598 bytes more]"},
		// "é" is 2 bytes: 40 minus the 27-byte mark leaves 13, the cut backs up to 12.
		{"rune boundary", strings.Repeat("é", 1000), 40, strings.Repeat("é", 6) + "… [cut: 1,988 bytes more]"},
		{"just over", "abcdefghijklmnopqrstuvwxyz0123", 29, "abcde… [cut: 25 bytes more]"},
		{"no room for the mark", "0123456789", 4, "0123"},
		{"no room, rune boundary", "日本語", 4, "日"},
		{"negative", "abc", -1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := textcut.Cut(tt.s, tt.n)
			if got != tt.want {
				t.Fatalf("Cut(%d bytes, %d) = %q, want %q", len(tt.s), tt.n, got, tt.want)
			}
			if len(got) > max(tt.n, 0) && len(tt.s) > tt.n {
				t.Errorf("Cut kept %d bytes, more than %d", len(got), tt.n)
			}
			if again := textcut.Cut(got, tt.n); again != got {
				t.Errorf("Cut is not idempotent: %q, then %q", got, again)
			}
		})
	}
}

func TestMark(t *testing.T) {
	for n, want := range map[int]string{
		1: "… [cut: 1 byte more]", 999: "… [cut: 999 bytes more]", 1000: "… [cut: 1,000 bytes more]",
		3_000_000: "… [cut: 3,000,000 bytes more]",
	} {
		if got := textcut.Mark(n); got != want {
			t.Errorf("Mark(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestList(t *testing.T) {
	tests := []struct {
		name        string
		items       []string
		n, each     int
		want        []string
		wantEntries int
	}{
		{"nil", nil, 3, 10, nil, 0},
		{"empty", []string{}, 3, 10, []string{}, 0},
		{"fits", []string{"a", "b", "c"}, 3, 10, []string{"a", "b", "c"}, 3},
		{"entries cut", []string{"short", strings.Repeat("x", 50)}, 3, 30,
			[]string{"short", "xxxxxx… [cut: 44 bytes more]"}, 2},
		{"too many", []string{"a", "b", "c", "dd", "eee"}, 3, 10,
			[]string{"a", "b", "… [cut: 3 more entries, 6 bytes]"}, 3},
		{"one over", []string{"a", "b", "c", "d"}, 3, 10, []string{"a", "b", "… [cut: 2 more entries, 2 bytes]"}, 3},
		{"n of one", []string{"a", "b"}, 1, 10, []string{"… [cut: 2 more entries, 2 bytes]"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := textcut.List(tt.items, tt.n, tt.each)
			if !reflect.DeepEqual(got, tt.want) || len(got) != tt.wantEntries {
				t.Fatalf("List = %q, want %q", got, tt.want)
			}
		})
	}
}

// Whatever the text and the limit, a cut fits the limit, keeps a start of
// the text, stays valid UTF-8 when the text was, and says it was cut.
func FuzzCut(f *testing.F) {
	f.Add("plain", 3)
	f.Add(strings.Repeat("é", 100), 31)
	f.Add("日本語\xff\xfe\x80\x80\x80\x80 text", 40)
	f.Add(strings.Repeat("\x80", 64), 33)
	f.Fuzz(func(t *testing.T, s string, n int) {
		n %= 1 << 16
		got := textcut.Cut(s, n)
		if len(s) <= n {
			if got != s {
				t.Fatalf("Cut(%q, %d) = %q: a text that fits changed", s, n, got)
			}
			return
		}
		if len(got) > max(n, 0) {
			t.Fatalf("Cut(%d bytes, %d) kept %d bytes", len(s), n, len(got))
		}
		start, mark, marked := strings.Cut(got, "… [cut: ")
		if !strings.HasPrefix(s, start) {
			t.Fatalf("Cut(%q, %d) = %q does not keep a start of the text", s, n, got)
		}
		if marked && mark != strings.TrimPrefix(textcut.Mark(len(s)-len(start)), "… [cut: ") {
			t.Fatalf("Cut(%q, %d) = %q: the mark does not count the %d bytes left out", s, n, got, len(s)-len(start))
		}
		if !marked && n >= len(textcut.Mark(len(s))) {
			t.Fatalf("Cut(%q, %d) = %q: room for the mark, but none", s, n, got)
		}
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Fatalf("Cut(%q, %d) = %q is not valid UTF-8", s, n, got)
		}
		if textcut.Cut(got, n) != got {
			t.Fatalf("Cut is not idempotent on %q", got)
		}
	})
}
