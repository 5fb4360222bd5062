// Package textcut bounds text that comes from a model, an agent or a tool
// before it is stored: in an event (the servers' max_payload is 1 MB), a
// task's state or a subject's history. Every cut is marked, so a reader
// knows the text goes on: "… [cut: 12,345 bytes more]".
//
// It also shortens text shown to people — a log line, an error, a table
// cell — where a bare "…" marks the cut (Clip, ClipEnd, ClipRunes), and
// gives the start or end of a text (Start, End). Every cut, marked or not,
// falls on a rune boundary: no function here splits a UTF-8 character.
package textcut

import (
	"strconv"
	"unicode/utf8"
)

// Cut returns s when it is at most n bytes long. Otherwise it returns the
// longest start of s that ends on a rune boundary, followed by the Mark of
// what it leaves out, n bytes at most in all (only the start when n leaves
// no room for the mark). Cut(Cut(s, n), n) is Cut(s, n).
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n = max(n, 0)
	// The mark of everything but the kept start is at least as long as
	// the mark of what is finally left out: the total stays within n.
	keep := n - len(Mark(len(s)))
	if keep < 0 {
		return s[:runeStart(s, n)]
	}
	keep = runeStart(s, keep)
	return s[:keep] + Mark(len(s)-keep)
}

// Mark is what ends a text that was cut with n bytes left out.
func Mark(n int) string { return "… [cut: " + count(n, "byte", "bytes") + " more]" }

// List bounds a list of texts: each is Cut to each bytes; of a list longer
// than n the first n-1 are kept and a last entry says how many more there
// were and their size ("… [cut: 17 more entries, 8,123 bytes]"). nil
// stays nil.
func List(items []string, n, each int) []string {
	if items == nil {
		return nil
	}
	n = max(n, 1)
	kept := len(items)
	if kept > n {
		kept = n - 1
	}
	out := make([]string, 0, min(len(items), n))
	for _, s := range items[:kept] {
		out = append(out, Cut(s, each))
	}
	if kept < len(items) {
		rest := 0
		for _, s := range items[kept:] {
			rest += len(s)
		}
		out = append(out, "… [cut: "+count(len(items)-kept, "more entry", "more entries")+", "+count(rest, "byte", "bytes")+"]")
	}
	return out
}

// Ellipsis marks where Clip, ClipEnd and ClipRunes cut a text.
const Ellipsis = "…"

// Clip returns s when it is at most n bytes long, otherwise Start(s, n)
// followed by Ellipsis (n+3 bytes at most): text for people, where how
// much was left out does not matter.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Start(s, n) + Ellipsis
}

// ClipEnd returns s when it is at most n bytes long, otherwise Ellipsis
// followed by End(s, n): the end of a text, where its news is (a command's
// last output).
func ClipEnd(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Ellipsis + End(s, n)
}

// ClipRunes returns s when it has at most n runes, otherwise its first n
// runes followed by Ellipsis.
func ClipRunes(s string, n int) string {
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos] + Ellipsis
		}
		i++
	}
	return s
}

// Start is the longest start of s of at most n bytes that ends on a rune
// boundary: s when it fits, "" when n ≤ 0.
func Start(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:runeStart(s, max(n, 0))]
}

// End is the longest end of s of at most n bytes that starts on a rune
// boundary: s when it fits, "" when n ≤ 0.
func End(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[runeEnd(s, len(s)-max(n, 0)):]
}

// runeStart is the largest i ≤ n at which a rune of s starts (n itself
// when s is not valid UTF-8 there: a cut never backs up past a rune).
func runeStart(s string, n int) int {
	for i := n; i > n-utf8.UTFMax && i > 0; i-- {
		if i >= len(s) || utf8.RuneStart(s[i]) {
			return i
		}
	}
	if n < utf8.UTFMax {
		return 0
	}
	return n
}

// runeEnd is the smallest i ≥ n at which a rune of s starts, or len(s)
// (n itself when s is not valid UTF-8 there: a cut never skips past a
// rune).
func runeEnd(s string, n int) int {
	for i := n; i < n+utf8.UTFMax && i <= len(s); i++ {
		if i == len(s) || utf8.RuneStart(s[i]) {
			return i
		}
	}
	return n
}

// count is n and the noun, singular or plural.
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return thousands(n) + " " + many
}

// thousands writes n with a comma between each group of three digits.
func thousands(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return s
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
