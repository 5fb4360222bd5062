package textcut_test

import (
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
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

func TestClip(t *testing.T) {
	tests := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"fits", "short", 5, "short"},
		{"cut", "abcdefgh", 5, "abcde…"},
		{"zero", "abc", 0, "…"},
		{"negative", "abc", -1, "…"},
		// "é" is 2 bytes: a cut at 5 would split the third; it backs up to 4.
		{"rune boundary", "ééééé", 5, "éé…"},
		// "日" is 3 bytes: 7 would split the third character.
		{"three-byte runes", "日本語です", 7, "日本…"},
		{"emoji", "ok 👍👍", 5, "ok …"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := textcut.Clip(tt.s, tt.n); got != tt.want {
				t.Fatalf("Clip(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
			}
		})
	}
}

func TestClipEnd(t *testing.T) {
	tests := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"fits", "short", 5, "short"},
		{"cut", "abcdefgh", 3, "…fgh"},
		{"zero", "abc", 0, "…"},
		// The last 3 bytes of "ééé" start inside the second "é": skipped.
		{"rune boundary", "ééé", 3, "…é"},
		{"three-byte runes", "exit: 日本語", 7, "…本語"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := textcut.ClipEnd(tt.s, tt.n); got != tt.want {
				t.Fatalf("ClipEnd(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
			}
		})
	}
}

func TestClipRunes(t *testing.T) {
	tests := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"fits", "short", 5, "short"},
		{"cut", "abcdefgh", 3, "abc…"},
		{"counts runes, not bytes", "ééééé", 3, "ééé…"},
		{"fits in runes", "日本語", 3, "日本語"},
		{"zero", "abc", 0, "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := textcut.ClipRunes(tt.s, tt.n); got != tt.want {
				t.Fatalf("ClipRunes(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
			}
		})
	}
}

func TestStartEnd(t *testing.T) {
	tests := []struct {
		s          string
		n          int
		start, end string
	}{
		{"abc", 3, "abc", "abc"},
		{"abc", 2, "ab", "bc"},
		{"abc", 0, "", ""},
		{"abc", -2, "", ""},
		{"aéb", 2, "a", "b"},
		{"日本", 4, "日", "本"},
		{"😀x", 3, "", "x"},
	}
	for _, tt := range tests {
		if got := textcut.Start(tt.s, tt.n); got != tt.start {
			t.Errorf("Start(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.start)
		}
		if got := textcut.End(tt.s, tt.n); got != tt.end {
			t.Errorf("End(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.end)
		}
	}
}

// Whatever the text and the limit, Start and End keep at most n bytes of
// one end of the text, valid UTF-8 when the text was, and Clip and ClipEnd
// add the ellipsis exactly when they cut.
func FuzzStartEnd(f *testing.F) {
	f.Add("plain", 3)
	f.Add(strings.Repeat("é", 100), 31)
	f.Add("日本語\xff\xfe\x80\x80\x80\x80 text", 9)
	f.Add(strings.Repeat("\x80", 64), 33)
	f.Fuzz(func(t *testing.T, s string, n int) {
		n %= 1 << 16
		start, end := textcut.Start(s, n), textcut.End(s, n)
		for _, c := range []struct{ name, got string }{{"Start", start}, {"End", end}} {
			if len(c.got) > max(n, 0) && len(s) > n {
				t.Fatalf("%s(%q, %d) = %q: more than %d bytes", c.name, s, n, c.got, n)
			}
			if utf8.ValidString(s) && !utf8.ValidString(c.got) {
				t.Fatalf("%s(%q, %d) = %q is not valid UTF-8", c.name, s, n, c.got)
			}
		}
		if !strings.HasPrefix(s, start) || !strings.HasSuffix(s, end) {
			t.Fatalf("Start, End (%q, %d) = %q, %q: not an end of the text", s, n, start, end)
		}
		if utf8.ValidString(s) && len(s) > n && n >= utf8.UTFMax && (len(start) <= n-utf8.UTFMax || len(end) <= n-utf8.UTFMax) {
			t.Fatalf("Start, End (%q, %d) = %q, %q: backed up more than a rune", s, n, start, end)
		}
		clip, clipEnd := textcut.Clip(s, n), textcut.ClipEnd(s, n)
		if len(s) <= n && (clip != s || clipEnd != s) || len(s) > n && (clip != start+textcut.Ellipsis || clipEnd != textcut.Ellipsis+end) {
			t.Fatalf("Clip, ClipEnd (%q, %d) = %q, %q", s, n, clip, clipEnd)
		}
	})
}
