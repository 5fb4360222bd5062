// Package xmltext escapes text for the XML-ish blocks injected into prompts
// (<previous_attempts>, <dead_ends>, <last_error>…), so that text from a
// model, a tool or a human can never close an element or open a new one.
package xmltext

import (
	"strings"
	"unicode/utf8"
)

// Mode says where the text goes.
type Mode int

const (
	// Text is character data: & < > and \r are escaped, quotes, newlines
	// and tabs stay as they are (multi-line output stays readable).
	Text Mode = iota
	// Quoted is also safe inside an attribute value: quotes are escaped too,
	// newlines and tabs stay literal (a parser may read them as spaces).
	Quoted
	// Attr is an attribute value that reads back exactly: newlines and tabs
	// are escaped as well.
	Attr
)

// Escape makes s safe for mode. Invalid UTF-8 and characters outside the XML
// 1.0 character range become U+FFFD.
func Escape(s string, mode Mode) string {
	if !needs(s, mode) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + len(s)/8)
	for _, r := range s { // an invalid byte ranges as utf8.RuneError, U+FFFD
		switch {
		case r == '&':
			b.WriteString("&amp;")
		case r == '<':
			b.WriteString("&lt;")
		case r == '>':
			b.WriteString("&gt;")
		case r == '\r':
			b.WriteString("&#xD;")
		case mode >= Quoted && r == '"':
			b.WriteString("&#34;")
		case mode >= Quoted && r == '\'':
			b.WriteString("&#39;")
		case mode == Attr && r == '\n':
			b.WriteString("&#xA;")
		case mode == Attr && r == '\t':
			b.WriteString("&#x9;")
		case !Char(r):
			b.WriteRune(utf8.RuneError)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func needs(s string, mode Mode) bool {
	for i := 0; i < len(s); {
		r, width := utf8.DecodeRuneInString(s[i:])
		i += width
		switch {
		case r == utf8.RuneError && width == 1, r == '&', r == '<', r == '>', r == '\r', !Char(r):
			return true
		case mode >= Quoted && (r == '"' || r == '\''):
			return true
		case mode == Attr && (r == '\n' || r == '\t'):
			return true
		}
	}
	return false
}

// Char reports whether r may appear in an XML 1.0 document.
func Char(r rune) bool {
	return r == '\t' || r == '\n' || r == '\r' ||
		r >= 0x20 && r <= 0xD7FF ||
		r >= 0xE000 && r <= 0xFFFD ||
		r >= 0x10000 && r <= 0x10FFFF
}
